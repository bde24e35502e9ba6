"""The VF store's listing and its lock statistics, on both implementations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sriov_cni import store
from sriov_cni.store import Allocation, FileStore, MemoryStore, Store


def record(pci: str) -> Allocation:
    return Allocation(pci, "0000:3b:00.0", "pf0", 0, "net", "ctr", "net1", "/var/run/netns/pod", None)


@pytest.fixture(params=["file", "memory"])
def vf_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return FileStore(tmp_path / "data") if request.param == "file" else MemoryStore()


def test_ids_are_the_recorded_vfs(vf_store: Store) -> None:
    assert set(vf_store.ids()) == set()
    with vf_store.locked():
        for pci in ("0000:3b:10.1", "0000:3b:10.0", "0000:3b:10.2"):
            vf_store.put(record(pci))
        vf_store.remove("0000:3b:10.1")
        assert set(vf_store.ids()) == {"0000:3b:10.0", "0000:3b:10.2"}
        assert {a.vf_pci for a in vf_store.all()} == set(vf_store.ids())


def test_ids_read_no_record(tmp_path: Path) -> None:
    # An allocation must not depend on reading the records of taken VFs.
    files = FileStore(tmp_path / "data")
    files.put(record("0000:3b:10.0"))
    (files.vfs_dir / "0000:3b:10.0.json").write_text("{not json")
    assert set(files.ids()) == {"0000:3b:10.0"}


@pytest.fixture
def lock_times() -> Iterator[list[tuple[float, float]]]:
    store.lock_times = []
    try:
        yield store.lock_times
    finally:
        store.lock_times = None


def test_each_lock_section_records_its_wait_and_hold(tmp_path: Path, lock_times: list[tuple[float, float]]) -> None:
    files = FileStore(tmp_path / "data")
    for pci in ("0000:3b:10.0", "0000:3b:10.1"):
        with files.locked():
            files.put(record(pci))
    assert len(lock_times) == 2
    assert all(wait >= 0 and hold > 0 for wait, hold in lock_times)
