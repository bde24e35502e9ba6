"""VF claims: one CNI call at a time changes a VF (see sriov_cni/vfstore.py).

The race they close: a pod's netns is gone, so its record is stale; the
runtime's DEL for that pod and another pod's ADD, reclaiming the stale VF,
run at once.  Both used to restore the VF, and the DEL could undo the PF
settings the ADD had just made for its own pod.  Here another process holds
the claim, as a DEL or ADD in flight would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sriov_cni.kernel.vfsettings import PfSettings, Vlan
from sriov_cni.vfstore import Allocation, FileStore, Store
from tests.plugin.delgc import ok, stale_record
from tests.support.fakes import MemoryVfStore
from tests.support.pluginlib import Node


def _opened_by(pid: int, path: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            continue
    return False


@contextmanager
def claimed_elsewhere(
    data_dir: Path, vf_pci: str, then: Callable[[], None] = lambda: None
) -> Iterator[Callable[[], None]]:
    """A child process holds ``vf_pci``'s claim until the block ends, or until this process waits for it.

    The block is given ``drop_when_waited``: from then on, once this
    process has the claim's lock file open (a call waiting for the claim),
    the child runs ``then`` and exits, which drops the claim.  So the
    holder lets go while the call waits, however late a loaded machine
    runs either, rather than after a fixed time that the call may not
    reach.
    """
    lock = os.path.realpath(Path(data_dir) / "claims" / f"{vf_pci}.lock")
    parent = os.getpid()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(ready_r)
            os.close(go_w)
            claim = FileStore(data_dir).claim(vf_pci)
            assert claim is not None
            os.write(ready_w, b"x")
            if os.read(go_r, 1) == b"x":
                # Bounded for a parent that never waits: the test then
                # fails on the child's status.
                deadline = time.monotonic() + 120
                while not _opened_by(parent, lock):
                    assert time.monotonic() < deadline, "the call never waited for the claim"
                    time.sleep(0.01)
                then()
            status = 0
        finally:
            os._exit(status)
    os.close(ready_w)
    os.close(go_r)

    def drop_when_waited() -> None:
        os.write(go_w, b"x")

    try:
        assert os.read(ready_r, 1) == b"x", "the child could not claim the VF"
        yield drop_when_waited
    finally:
        os.close(ready_r)
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    assert status == 0, "the claim's holder failed"


def test_add_passes_over_a_stale_vf_another_call_is_giving_back(node: Node) -> None:
    pf = node.add_pf(1)
    stale_record(node, vlan=Vlan(42, 0, 0x8100))
    node.fake.state[pf.name][0]["vlan"] = 42
    before = node.picture()

    with claimed_elsewhere(node.data_dir, pf.vfs[0].pci):
        res = node.cni("ADD", node.conf(), netns=node.pod(), container="new")
        assert res.rc != 0 and res.code == 101, res.stdout
        assert "another CNI call is giving it back" in res.out["details"]
        assert node.fake.calls == []
        assert {k: v for k, v in node.picture().items() if k != "pods"} == {
            k: v for k, v in before.items() if k != "pods"
        }

    node.add(node.conf(), netns=node.pod(), container="new")
    assert node.fake.calls[0] == ("vlan", pf.name, 0, (0, 0, 0x8100))


def test_add_passes_over_a_free_vf_still_claimed(node: Node) -> None:
    pf = node.add_pf(2)
    with claimed_elsewhere(node.data_dir, pf.vfs[0].pci):
        res = node.add(node.conf("1.1.0"), netns=node.pod(), container="c1")
    assert res.out["interfaces"][0]["pciID"] == pf.vfs[1].pci


def test_del_waits_for_the_claim_then_answers_try_again(node: Node) -> None:
    pf = node.add_pf(1)
    pod = node.pod()
    conf = node.conf(vlan=7)
    node.add(conf, netns=pod)
    during = node.picture()
    node.claim_wait = 0.3

    with claimed_elsewhere(node.data_dir, pf.vfs[0].pci):
        res = node.cni("DEL", conf, netns=pod)
        assert res.rc != 0 and res.code == 11, res.stdout
        assert "stayed claimed by another CNI call" in res.out["details"]
        assert node.picture() == during

    ok(node.cni("DEL", conf, netns=pod))
    assert node.records() == []


def test_del_of_a_vf_reclaimed_while_it_waited_leaves_it_alone(node: Node) -> None:
    """The DEL of a dead pod finds, once it has the claim, that an ADD reclaimed the VF."""
    pf = node.add_pf(1)
    dead = stale_record(node, vlan=Vlan(42, 0, 0x8100))
    node.fake.state[pf.name][0]["vlan"] = 42

    def reclaim() -> None:
        taken = FileStore(node.data_dir).get(pf.vfs[0].pci)
        assert taken is not None
        taken.container_id = "new"
        FileStore(node.data_dir).put(taken)

    with claimed_elsewhere(node.data_dir, pf.vfs[0].pci, reclaim) as drop_when_waited:
        drop_when_waited()
        ok(node.cni("DEL", node.conf(), netns=dead.netns, container=dead.container_id))

    assert node.fake.calls == []
    assert node.fake.state[pf.name][0]["vlan"] == 42
    [record] = FileStore(node.data_dir).all()
    assert record.container_id == "new"


def test_del_that_waited_for_its_add_gives_back_what_that_add_recorded(node: Node) -> None:
    """A DEL sent while its ADD still ran found the record as the ADD began; it puts the VF back as the ADD left it.

    A runtime that gave up waiting for an ADD sends its DEL, and the ADD
    runs on.  What the DEL read before it had the claim says nothing was
    changed yet; restoring from that would leave the VF in the pod, with
    its VLAN set, and drop the record that says so.
    """
    pf = node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(vlan=7)
    node.add(conf, netns=pod)
    [done] = FileStore(node.data_dir).all()
    assert done.in_pod and done.original is not None and done.applied.vlan is not None
    begun = Allocation.from_json(done.to_json())
    begun.original, begun.applied, begun.in_pod = None, PfSettings(), False

    def add_ends() -> None:
        FileStore(node.data_dir).put(done)

    FileStore(node.data_dir).put(begun)
    with claimed_elsewhere(node.data_dir, pf.vfs[0].pci, add_ends) as drop_when_waited:
        drop_when_waited()
        ok(node.cni("DEL", conf, netns=pod))

    assert node.records() == []
    assert node.picture() == before


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return FileStore(tmp_path) if request.param == "file" else MemoryVfStore()


def test_a_claim_has_one_holder_until_dropped(store: Store) -> None:
    first = store.claim("0000:3b:10.0")
    assert first is not None
    assert store.claim("0000:3b:10.0") is None
    assert store.claim("0000:3b:10.0", wait=0.2) is None
    other = store.claim("0000:3b:10.1")
    assert other is not None
    first.drop()
    first.drop()  # idempotent
    with store.claim("0000:3b:10.0") as again:  # type: ignore[union-attr]
        assert again is not None
        assert store.claim("0000:3b:10.0") is None
    assert store.claim("0000:3b:10.0") is not None


def test_a_claim_waited_for_is_taken_when_its_holder_ends(tmp_path: Path) -> None:
    # The holder is another process, which exits without releasing: the
    # kernel drops its lock, and the waiter gets the claim within its wait.
    with claimed_elsewhere(tmp_path, "0000:3b:10.0") as drop_when_waited:
        assert FileStore(tmp_path).claim("0000:3b:10.0") is None
        drop_when_waited()
        claim = FileStore(tmp_path).claim("0000:3b:10.0", wait=120.0)
        assert claim is not None
        claim.drop()
