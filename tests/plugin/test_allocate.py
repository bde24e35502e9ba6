"""allocate.reserve on a generated sysfs tree: a VF judged without its claim is checked again under it.

reserve judges VFs without their claims, so another call may record,
reclaim or give back a VF between that judgement and the claim.  The
raced stores here let such a call run at exactly that point, holding the
claim itself as every change of a record must; threads racing reserve over
a small pool check the same on real timing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sriov_cni import vfstate
from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel import sysfs
from sriov_cni.kernel.vfsettings import PfSettings
from sriov_cni.paths import Paths
from sriov_cni.plugin import allocate
from sriov_cni.plugin.lease import NewLease
from sriov_cni.plugin.pool import parse_pool_entry, pool_vfs
from sriov_cni.vfstore import Allocation, Claim, FileStore, OriginalState, Store
from tests.support.fakes import FakeHost, MemoryVfStore
from tests.support.nodetree import Tree


def attachment(container: str = "ours") -> allocate.Attachment:
    return allocate.Attachment(container, "net1", "net", "/proc/self/ns/net", None)


def make(vf: sysfs.VF, container: str = "ours") -> Allocation:
    """A record as reserve writes it for ``container``: another call's, put in place by a test."""
    return Allocation(vf.pci, vf.pf.pci, "eth0", vf.index, "net", container, "net1", "/proc/self/ns/net", None)


def take(
    tree: Tree,
    store: Store,
    candidates: list[sysfs.VF],
    container: str = "ours",
    named: bool = False,
    host: allocate.Host | None = None,
) -> NewLease:
    """allocate.reserve for ``container``'s attachment, with the host namespace of the tree unless ``host``.

    ``named``: the one VF of ``candidates`` is a device plugin's choice, described as ADD describes it.
    """
    if named:
        [vf] = candidates
        chosen = allocate.Candidates.of_named(sysfs.describe(tree.sys, vf))
    else:
        chosen = allocate.Candidates(candidates)
    return allocate.reserve(store, chosen, attachment(container), host or FakeHost(tree.sys), Paths(sys=tree.sys))


class Meanwhile:
    """``change`` runs once, as another call holding ``vf_pci``'s claim, just before the claim is first granted."""

    def __init__(self, vf_pci: str, change: Callable[[Store], None]) -> None:
        self.vf_pci = vf_pci
        self.change: Callable[[Store], None] | None = change

    def before_claim(self, store: Store, vf_pci: str) -> None:
        if vf_pci == self.vf_pci and self.change is not None:
            change, self.change = self.change, None
            held = store.claim(vf_pci)
            assert held is not None
            with held:
                change(store)


class RacedFiles(FileStore):
    def __init__(self, root: Path, meanwhile: Meanwhile) -> None:
        super().__init__(root)
        self.meanwhile = meanwhile

    def claim(self, vf_pci: str, wait: float = 0.0) -> Claim | None:
        self.meanwhile.before_claim(self, vf_pci)
        return super().claim(vf_pci, wait)


class RacedMemory(MemoryVfStore):
    def __init__(self, meanwhile: Meanwhile) -> None:
        super().__init__()
        self.meanwhile = meanwhile

    def claim(self, vf_pci: str, wait: float = 0.0) -> Claim | None:
        self.meanwhile.before_claim(self, vf_pci)
        return super().claim(vf_pci, wait)


def raced(kind: str, tmp_path: Path, vf_pci: str, change: Callable[[Store], None]) -> Store:
    meanwhile = Meanwhile(vf_pci, change)
    return RacedFiles(tmp_path / "data", meanwhile) if kind == "file" else RacedMemory(meanwhile)


def fresh(kind: str, tmp_path: Path) -> Store:
    return FileStore(tmp_path / "data") if kind == "file" else MemoryVfStore()


def pool(tree: Tree, vfs: int) -> list[sysfs.VF]:
    tree.igb(vfs=vfs)
    return pool_vfs(tree.sys, [parse_pool_entry("eth0")])


class Nowhere:
    """A host namespace without any of the VFs' netdevs: each sits in some other namespace."""

    def find(self, name: str) -> object | None:
        return None


def reserve(tree: Tree, store: Store, candidates: list[sysfs.VF]) -> Allocation:
    lease = take(tree, store, candidates)
    lease.claim.drop()
    assert lease.stale is None
    return lease.alloc


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_vf_recorded_by_another_add_meanwhile_is_not_taken_twice(tree: Tree, tmp_path: Path, kind: str) -> None:
    # The rival ADD looked at the store when this one did, claimed the first
    # VF first, recorded it and let go of the claim: this one gets the claim
    # of a VF that is no longer free.
    candidates = pool(tree, 3)
    store = raced(kind, tmp_path, candidates[0].pci, lambda s: s.put(make(candidates[0], "rival")))
    alloc = reserve(tree, store, candidates)
    assert alloc.vf_pci == candidates[1].pci
    owners = {a.vf_pci: a.container_id for a in store.all()}
    assert owners == {candidates[0].pci: "rival", candidates[1].pci: "ours"}


def _race(tree: Tree, store: Store, candidates: list[sysfs.VF], adds: int) -> tuple[dict[int, str], list[int]]:
    """``adds`` ADDs released at once; the VF each got, and the codes of those refused."""
    start = threading.Barrier(adds)
    got: dict[int, str] = {}
    refused: list[int] = []

    def add(i: int) -> None:
        start.wait()
        try:
            lease = take(tree, store, candidates, f"c{i}")
        except CNIError as exc:
            refused.append(exc.code)
            return
        # Let go at once, the record staying: an ADD that looked at the
        # store before it was written gets the claim of a taken VF.
        lease.claim.drop()
        got[i] = lease.alloc.vf_pci

    threads = [threading.Thread(target=add, args=(i,)) for i in range(adds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got, refused


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_adds_racing_over_a_small_pool_never_share_a_vf(tree: Tree, tmp_path: Path, kind: str) -> None:
    candidates = pool(tree, 3)
    adds = 6
    for round_ in range(20):
        store = fresh(kind, tmp_path / str(round_))
        got, refused = _race(tree, store, candidates, adds)
        assert sorted(got.values()) == [vf.pci for vf in candidates], (round_, got)
        assert refused == [Code.NO_FREE_VF] * (adds - len(candidates))
        assert {a.vf_pci: a.container_id for a in store.all()} == {pci: f"c{i}" for i, pci in got.items()}


def test_the_pool_fills_in_order_then_runs_dry(tree: Tree, tmp_path: Path) -> None:
    candidates = pool(tree, 3)
    store = FileStore(tmp_path / "data")
    assert [reserve(tree, store, candidates).vf_pci for _ in range(3)] == [vf.pci for vf in candidates]
    with pytest.raises(CNIError) as err:
        reserve(tree, store, candidates)
    assert err.value.code == Code.NO_FREE_VF
    # Every write was renamed into place or removed: only records remain.
    assert sorted(p.name for p in store.vfs_dir.iterdir()) == sorted(f"{vf.pci}.json" for vf in candidates)


@pytest.mark.parametrize("entry", ["eth0", "eth0#3", "eth0#0-3", "0000:01:00.0#0-3,5,7-9"])
def test_a_pool_entry_prints_as_written(entry: str) -> None:
    assert str(parse_pool_entry(entry)) == entry


def test_a_pool_entry_is_sorted_deduplicated_and_printed_as_runs() -> None:
    entry = parse_pool_entry("eth0# 9 ,3-3,0-1,2,1")
    assert entry.runs == ((0, 3), (9, 9))
    assert str(entry) == "eth0#0-3,9"


def test_the_highest_sriov_vf_index_is_accepted_and_one_more_is_not() -> None:
    assert parse_pool_entry("eth0#65535").runs == ((65535, 65535),)
    for entry in ("eth0#65536", "eth0#65530-65536"):
        with pytest.raises(ValueError, match="above 65535"):
            parse_pool_entry(entry)


def test_a_pool_entry_costs_its_length_not_the_vfs_it_spans() -> None:
    # Eight bytes of config, one run: not 65536 numbers per entry.
    assert parse_pool_entry("eth0#0-65535").runs == ((0, 65535),)
    assert parse_pool_entry("eth0#5-9,0-4,20,21").runs == ((0, 9), (20, 21))


def test_a_long_pfnames_list_resolves_each_pf_once(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    vfs = tree.igb(vfs=4)
    resolved: list[str] = []
    real = sysfs.resolve_pf

    def counted(root: Path, name: str) -> sysfs.PF:
        resolved.append(name)
        return real(root, name)

    monkeypatch.setattr(sysfs, "resolve_pf", counted)
    entries = [parse_pool_entry(e) for e in ["eth0", "eth0#1", "0000:01:00.0#2-3"] * 1000]
    got = pool_vfs(tree.sys, entries)
    assert [vf.pci for vf in got] == [vfs[i] for i in range(4)]
    assert resolved == ["eth0", "0000:01:00.0"]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("eth0#3-2", "ends before it starts"),
        ("#3", "names no PF"),
        ("eth0#", "is not a VF index or range"),
        ("eth0#1-", "is not a VF index or range"),
        ("eth 0#1", "neither a PF netdev name nor a PCI address"),
    ],
)
def test_a_bad_pool_entry_is_refused_saying_why(entry: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_pool_entry(entry)


def test_overlapping_pool_entries_name_each_vf_once_in_order(tree: Tree) -> None:
    vfs = tree.igb(vfs=4)
    entries = [parse_pool_entry(e) for e in ("eth0#2,1", "eth0#1-3", "0000:01:00.0#0")]
    got = pool_vfs(tree.sys, entries)
    assert [(vf.index, vf.pci, vf.pf.pci) for vf in got] == [
        (1, vfs[1], "0000:01:00.0"),
        (2, vfs[2], "0000:01:00.0"),
        (3, vfs[3], "0000:01:00.0"),
        (0, vfs[0], "0000:01:00.0"),
    ]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("eth0#3", "asks for VF 3, but eth0 has sriov_numvfs=3"),
        ("eth0#2-3", "asks for VF 3, but eth0 has sriov_numvfs=3"),
        ("eth9", 'pfNames entry "eth9"'),
    ],
)
def test_a_pool_entry_beyond_the_pf_is_a_config_error(tree: Tree, entry: str, words: str) -> None:
    tree.igb(vfs=3)
    with pytest.raises(CNIError) as err:
        pool_vfs(tree.sys, [parse_pool_entry(entry)])
    assert err.value.code == Code.INVALID_CONFIG and words in err.value.msg, err.value.msg


def test_a_pf_this_node_lacks_is_passed_over_while_another_entry_serves(
    tree: Tree, caplog: pytest.LogCaptureFixture
) -> None:
    """One network for node pools with different NICs: eth9 is another pool's."""
    vfs = tree.igb(vfs=2)
    got = pool_vfs(tree.sys, [parse_pool_entry(e) for e in ("eth9#0-3", "eth0", "0000:99:00.0")])
    assert [vf.pci for vf in got] == [vfs[0], vfs[1]]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any('"eth9#0-3"' in w and "other entries serve" in w for w in warned), warned
    assert any("0000:99:00.0" in w for w in warned), warned
    with pytest.raises(CNIError) as err:
        pool_vfs(tree.sys, [parse_pool_entry(e) for e in ("eth9", "eth8")])
    assert err.value.code == Code.INVALID_CONFIG
    assert '"eth9"' in err.value.msg and '"eth8"' in err.value.msg, err.value.msg


def test_a_vf_sysfs_does_not_list_is_a_config_error(tree: Tree) -> None:
    tree.igb(vfs=3)
    (tree.devices / "0000:01:00.0" / "virtfn1").unlink()
    with pytest.raises(CNIError) as err:
        pool_vfs(tree.sys, [parse_pool_entry("eth0")])
    assert err.value.code == Code.INVALID_CONFIG and "eth0 has no VF 1 in sysfs" in err.value.msg


def test_vf_states(tree: Tree, tmp_path: Path) -> None:
    tree.igb(vfs=1)
    tree.vf("0000:01:00.0", 1, "0000:01:10.1", None, driver="vfio-pci")
    tree.vf("0000:01:00.0", 2, "0000:01:10.2", None)
    host = {"eth0v0"}
    vf0 = "0000:01:10.0"
    free = vfstate.vf_state(Paths(sys=tree.sys), vf0, None, host.__contains__)
    elsewhere = vfstate.vf_state(Paths(sys=tree.sys), vf0, None, lambda name: False)
    dpdk = vfstate.vf_state(Paths(sys=tree.sys), "0000:01:10.1", None, lambda name: False)
    no_netdev = vfstate.vf_state(Paths(sys=tree.sys), "0000:01:10.2", None, host.__contains__)
    assert (free, elsewhere, dpdk, no_netdev) == (
        vfstate.VfState.FREE,
        vfstate.VfState.IN_USE,
        vfstate.VfState.FREE,
        vfstate.VfState.IN_USE,
    )

    own = os.stat("/proc/self/ns/net").st_ino
    alloc = make(sysfs.VF(vf0, 0, sysfs.resolve_pf(tree.sys, "eth0")))
    # A record is judged by its namespace alone, whatever sysfs shows.
    for path, inode, state in [
        ("/proc/self/ns/net", None, vfstate.VfState.ALLOCATED),
        ("/proc/self/ns/net", own, vfstate.VfState.ALLOCATED),
        ("/proc/self/ns/net", own + 1, vfstate.VfState.STALE),  # the path now names another namespace
        (str(tmp_path / "gone"), None, vfstate.VfState.STALE),
    ]:
        alloc.netns, alloc.netns_inode = path, inode
        assert vfstate.vf_state(Paths(sys=tree.sys), vf0, alloc, host.__contains__) is state, (path, inode)


def record(store: Store, vf: sysfs.VF, container: str, netns: str) -> Allocation:
    alloc = make(vf, container)
    alloc.netns = netns
    alloc.original = OriginalState(pf=PfSettings(mac=f"02:00:00:00:00:0{vf.index}"), netdev=f"eth0v{vf.index}")
    store.put(alloc)
    stored = store.get(vf.pci)
    assert stored is not None
    return stored


def test_a_stale_vf_is_reclaimed_only_when_none_is_free(tree: Tree, tmp_path: Path) -> None:
    candidates = pool(tree, 2)
    store = FileStore(tmp_path / "data")
    dead = record(store, candidates[0], "dead", str(tmp_path / "gone"))

    assert reserve(tree, store, candidates).vf_pci == candidates[1].pci

    with take(tree, store, candidates) as lease:
        assert lease.stale == dead and lease.alloc.vf_pci == candidates[0].pci
        # The VF is still as the dead container left it: what it was before is the old record's.
        assert lease.alloc.original == dead.original
    assert store.get(candidates[0].pci) == lease.alloc and lease.alloc.container_id == "ours"

    with pytest.raises(CNIError) as err:
        reserve(tree, store, candidates)
    assert err.value.code == Code.NO_FREE_VF
    assert err.value.msg == "no free VF in the pool (2 VFs, all taken)"
    assert err.value.details == "; ".join(f"{vf.pci} (container ours, netns /proc/self/ns/net)" for vf in candidates)


def test_a_named_vf_that_is_not_free_is_named_with_its_owner(tree: Tree, tmp_path: Path) -> None:
    candidates = pool(tree, 2)
    store = FileStore(tmp_path / "data")
    record(store, candidates[0], "other", "/proc/self/ns/net")
    with pytest.raises(CNIError) as err:
        take(tree, store, candidates[:1], named=True)
    assert err.value.code == Code.NO_FREE_VF
    assert err.value.msg == f"VF {candidates[0].pci} (container other, netns /proc/self/ns/net) is not free"

    # Its netdev is in some other namespace, and no record says whose.
    with pytest.raises(CNIError) as err:
        take(tree, store, candidates[1:], named=True, host=Nowhere())
    assert err.value.msg == f"VF {candidates[1].pci} (its netdev is not in the host network namespace) is not free"
    assert store.get(candidates[1].pci) is None


def reclaim(tree: Tree, store: Store, candidates: list[sysfs.VF]) -> NewLease:
    with take(tree, store, candidates) as lease:
        return lease


def _rival_reclaims(store: Store, vf: sysfs.VF) -> None:
    # Both ADDs found the same dead container's record; the other one got
    # the claim first and put its own live record in its place.  Restoring
    # the VF from the dead record now would undo what that ADD set up.
    store.put(make(vf, "rival"))


def _given_back(store: Store, vf: sysfs.VF) -> None:
    # The dead container's DEL (or a GC) restored the VF and removed the
    # record while this ADD read it: the old record no longer describes the VF.
    store.remove(vf.pci)


@pytest.mark.parametrize("kind", ["file", "memory"])
@pytest.mark.parametrize("meanwhile, left", [(_rival_reclaims, ["rival"]), (_given_back, [])])
def test_a_stale_vf_changed_by_another_call_meanwhile_is_not_reclaimed(
    tree: Tree, tmp_path: Path, kind: str, meanwhile: Callable[[Store, sysfs.VF], None], left: list[str]
) -> None:
    candidates = pool(tree, 1)
    vf = candidates[0]
    store = raced(kind, tmp_path, vf.pci, lambda s: meanwhile(s, vf))
    record(store, vf, "dead", str(tmp_path / "gone"))
    with pytest.raises(CNIError) as err:
        reclaim(tree, store, candidates)
    assert err.value.code == Code.NO_FREE_VF
    assert err.value.details == f"{vf.pci} (given back or reclaimed by another CNI call meanwhile)"
    assert [(a.vf_pci, a.container_id) for a in store.all()] == [(vf.pci, owner) for owner in left]


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_stale_vf_is_reclaimed_from_its_record_as_it_is_under_the_claim(
    tree: Tree, tmp_path: Path, kind: str
) -> None:
    # The dead container's own ADD was still running when this ADD read its
    # record, and recorded more before it ended (the VF moved into the pod,
    # PF settings applied): the VF is put back from that, the latest record.
    candidates = pool(tree, 1)
    vf = candidates[0]
    later: list[Allocation] = []

    def dead_add_records_more(s: Store) -> None:
        current = s.get(vf.pci)
        assert current is not None
        current.in_pod = True
        current.applied = PfSettings(mac="02:00:00:00:00:aa")
        s.put(current)
        later.append(current)

    store = raced(kind, tmp_path, vf.pci, dead_add_records_more)
    record(store, vf, "dead", str(tmp_path / "gone"))
    lease = reclaim(tree, store, candidates)
    assert lease.stale == later[0] and lease.stale.in_pod
    assert lease.alloc.container_id == "ours" and lease.alloc.original == later[0].original
    assert store.get(vf.pci) == lease.alloc
