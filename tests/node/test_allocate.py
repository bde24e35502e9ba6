"""allocate.reserve on a generated sysfs tree: the choice made outside the lock stays race-free."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodetree import FakeHost, Tree
from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel import sysfs
from sriov_cni.plugin import allocate
from sriov_cni.plugin.store import Allocation, FileStore, MemoryStore, Staged, Store


def make(vf: sysfs.VF, container: str = "ours") -> Allocation:
    return Allocation(vf.pci, vf.pf.pci, "eth0", vf.index, "net", container, "net1", "/proc/self/ns/net", None)


class RacedStore(MemoryStore):
    """Another ADD records the VF this one is about to commit, between its staging and its lock."""

    def __init__(self) -> None:
        super().__init__()
        self.raced: list[str] = []

    def stage(self, alloc: Allocation) -> Staged:
        if not self.raced:
            self.raced.append(alloc.vf_pci)
            rival = Allocation.from_json(alloc.to_json())
            rival.container_id = "rival"
            with self.locked():
                self.put(rival)
        return super().stage(alloc)


def pool(tree: Tree, vfs: int) -> list[sysfs.VF]:
    tree.igb(vfs=vfs)
    return allocate.pool_vfs([allocate.parse_pool_entry("eth0")])


def reserve(store: Store, candidates: list[sysfs.VF]) -> Allocation:
    host = FakeHost()
    lease = allocate.reserve(store, candidates, make, lambda name: host.find(name) is not None, False)
    lease.release()
    assert lease.stale is None
    return lease.alloc


def test_a_vf_recorded_by_another_add_meanwhile_is_not_taken_twice(tree: Tree) -> None:
    candidates = pool(tree, 3)
    store = RacedStore()
    alloc = reserve(store, candidates)
    assert store.raced == [candidates[0].pci]
    assert alloc.vf_pci == candidates[1].pci
    owners = {a.vf_pci: a.container_id for a in store.all()}
    assert owners == {candidates[0].pci: "rival", candidates[1].pci: "ours"}


def test_the_pool_fills_in_order_then_runs_dry(tree: Tree, tmp_path: Path) -> None:
    candidates = pool(tree, 3)
    store = FileStore(tmp_path / "data")
    assert [reserve(store, candidates).vf_pci for _ in range(3)] == [vf.pci for vf in candidates]
    with pytest.raises(CNIError) as err:
        reserve(store, candidates)
    assert err.value.code == Code.NO_FREE_VF
    # Every staged write was committed or discarded: only records remain.
    assert sorted(p.name for p in store.vfs_dir.iterdir()) == sorted(f"{vf.pci}.json" for vf in candidates)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_staged_write_is_no_record_until_committed(kind: str, tmp_path: Path) -> None:
    store: Store = FileStore(tmp_path / "data") if kind == "file" else MemoryStore()
    alloc = Allocation("0000:02:10.0", "0000:01:00.0", "eth0", 0, "net", "c", "net1", "/proc/self/ns/net", None)
    discarded = store.stage(alloc)
    store.discard(discarded)
    staged = store.stage(alloc)
    assert store.get(alloc.vf_pci) is None and not store.ids()
    with store.locked():
        store.commit(staged)
    store.discard(staged)  # after a commit: changes nothing
    assert store.get(alloc.vf_pci) == alloc and set(store.ids()) == {alloc.vf_pci}
    if isinstance(store, FileStore):
        assert [p.name for p in store.vfs_dir.iterdir()] == [f"{alloc.vf_pci}.json"]
