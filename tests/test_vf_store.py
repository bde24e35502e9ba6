"""The VF store: one contract checked on both implementations, then what only the file store does.

The contract tests run against :class:`FileStore` on a temporary directory
and against :class:`MemoryVfStore`, the in-memory fake, so the fake cannot
drift from what the plugin relies on.  The file store's own duties (refusing
damaged or planted records, claims that other processes hold, atomic 0600
writes, measuring its claims) are checked on the real filesystem.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel.vfsettings import PfSettings, Rate, Vlan
from sriov_cni.vfstore import MAX_RECORD, Allocation, FileStore, OriginalState, SetAside, Store
from tests.support.fakes import MemoryVfStore

PCI_A = "0000:3b:10.0"
PCI_B = "0000:3b:10.1"


def allocation(vf_pci: str = PCI_A, container: str = "ctr1", **changes: object) -> Allocation:
    alloc = Allocation(
        vf_pci=vf_pci,
        pf_pci="0000:3b:00.0",
        pf_netdev="ens1f0",
        vf_index=int(vf_pci[-1]),
        network="sriov-net",
        container_id=container,
        ifname="net1",
        netns="/var/run/netns/pod",
        netns_inode=4026532000,
        created=1700000000.5,
    )
    for key, value in changes.items():
        setattr(alloc, key, value)
    return alloc


def original() -> OriginalState:
    return OriginalState(
        pf=PfSettings(
            vlan=Vlan(0, 0, 0x8100), mac="00:00:00:00:00:00", rate=Rate(0, 0), spoofchk=True, trust=None, link_state=0
        ),
        netdev="ens1f0v0",
        mtu=1500,
        mac="02:00:00:00:00:01",
        promisc=False,
        altnames=["enp59s0f0v0"],
        alias="",
    )


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        return FileStore(tmp_path / "data")
    return MemoryVfStore()


# --- the contract ---------------------------------------------------------------


def test_an_empty_store_has_nothing_and_removing_nothing_is_fine(store: Store) -> None:
    assert store.all() == []
    assert store.get(PCI_A) is None
    store.remove(PCI_A)
    assert store.all() == []


def test_a_record_reads_back_equal_with_its_snapshot_and_applied_settings(store: Store) -> None:
    applied = PfSettings(vlan=Vlan(100, 0, 0x8100), mac="02:00:00:00:00:99", spoofchk=False)
    alloc = allocation(original=original(), applied=applied, in_pod=True)
    store.put(alloc)
    got = store.get(PCI_A)
    assert got == alloc
    assert got is not None
    assert got.applied.items() == [("vlan", (100, 0, 0x8100)), ("mac", "02:00:00:00:00:99"), ("spoofchk", False)]
    assert got.original == original()


def test_put_replaces_remove_forgets_and_all_is_ordered_by_vf(store: Store) -> None:
    store.put(allocation(PCI_B, "ctr2"))
    store.put(allocation(PCI_A, "ctr1"))
    store.put(allocation(PCI_A, "ctr3"))
    assert [(a.vf_pci, a.container_id) for a in store.all()] == [(PCI_A, "ctr3"), (PCI_B, "ctr2")]
    store.remove(PCI_A)
    assert store.get(PCI_A) is None
    assert [a.vf_pci for a in store.all()] == [PCI_B]


def test_a_vf_set_aside_reads_back_apart_from_the_allocations_and_unset_forgets_it(store: Store) -> None:
    record = SetAside(PCI_B, "no carrier", "VF has no carrier", 1700000000.0, 1700000060.0, 2, 1700000180.0)
    store.put(allocation(PCI_A))
    store.set_aside(record)
    assert store.aside() == {PCI_B: record}
    assert [a.vf_pci for a in store.all()] == [PCI_A] and not store.has(PCI_B)
    record.failures = 3
    assert store.aside()[PCI_B].failures == 2, "the store must hold a copy"
    store.set_aside(record)
    assert store.aside()[PCI_B].failures == 3
    store.unset_aside(PCI_B)
    store.unset_aside(PCI_B)
    assert store.aside() == {}


def test_records_are_copies_not_shared_objects(store: Store) -> None:
    alloc = allocation(original=original())
    store.put(alloc)
    alloc.container_id = "changed after put"
    got = store.get(PCI_A)
    assert got is not None and got.container_id == "ctr1"
    got.in_pod = True
    assert got.original is not None
    got.original.altnames.append("changed after get")
    again = store.get(PCI_A)
    assert again is not None and not again.in_pod and again.original == original()


def test_a_record_keeps_pf_settings_in_one_layout_the_snapshot_and_the_applied_alike() -> None:
    applied = PfSettings(vlan=Vlan(100, 0, 0x8100), rate=Rate(0, 500), trust=True)
    raw = json.loads(allocation(original=original(), applied=applied).to_json())
    assert list(raw) == [
        "vf_pci",
        "pf_pci",
        "pf_netdev",
        "vf_index",
        "network",
        "container_id",
        "ifname",
        "netns",
        "netns_inode",
        "dpdk",
        "pod_namespace",
        "pod_name",
        "pod_uid",
        "created",
        "boot_id",
        "ipam_config",
        "cni_args",
        "cni_path",
        "giving_back",
        "original",
        "applied",
        "in_pod",
        "device_info_file",
        "unrestored",
        "rdma_device",
        "rdma_index",
        "rdma_soft",
        "rdma_memlock",
    ]
    assert raw["applied"] == {"vlan": [100, 0, 0x8100], "rate": [0, 500], "trust": True}
    # trust is None in the snapshot (a driver that does not report it): absent, as in applied.
    assert raw["original"] == {
        "pf": {"vlan": [0, 0, 0x8100], "mac": "00:00:00:00:00:00", "rate": [0, 0], "spoofchk": True, "link_state": 0},
        "netdev": "ens1f0v0",
        "mtu": 1500,
        "mac": "02:00:00:00:00:01",
        "promisc": False,
        "altnames": ["enp59s0f0v0"],
        "alias": "",
        "flags": {},
        "settings": {},
        "xdp": 0,
        "ethtool": {},
    }


def test_a_record_without_snapshot_stays_without_one(store: Store) -> None:
    store.put(allocation())
    got = store.get(PCI_A)
    assert got is not None and got.original is None and got.applied == PfSettings()


# --- the file store's own duties --------------------------------------------------


def test_ids_and_has_are_the_recorded_vfs(store: Store) -> None:
    assert set(store.ids()) == set()
    assert not store.has("0000:3b:10.0")
    for pci in ("0000:3b:10.1", "0000:3b:10.0", "0000:3b:10.2"):
        store.put(allocation(pci))
    store.remove("0000:3b:10.1")
    assert set(store.ids()) == {"0000:3b:10.0", "0000:3b:10.2"}
    assert {a.vf_pci for a in store.all()} == set(store.ids())
    assert [store.has(pci) for pci in ("0000:3b:10.0", "0000:3b:10.1", "0000:3b:10.2")] == [True, False, True]


@pytest.fixture
def files(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "data")


def refused(files: FileStore, path: Path, words: str) -> CNIError:
    """get() and all() both refuse the record at ``path``, naming it."""
    with pytest.raises(CNIError) as by_get:
        files.get(PCI_A)
    with pytest.raises(CNIError) as by_all:
        files.all()
    for err in (by_get.value, by_all.value):
        assert err.code == Code.IO_FAILURE and str(path) in err.msg and words in err.msg, err.msg
    return by_get.value


@pytest.mark.parametrize("content", [b'{"vf_pci": "0000:3b:1', b"[]", b"{}", b"\xff\xfe", b""])
def test_a_damaged_record_is_refused_not_read_as_free(files: FileStore, content: bytes) -> None:
    # Reading it as "no record" would hand the VF out a second time.
    files.put(allocation())
    path = files.vfs_dir / f"{PCI_A}.json"
    path.write_bytes(content)
    err = refused(files, path, "unreadable")
    assert "remove the file" in err.details


def test_scan_names_an_unreadable_record_and_reads_the_others(files: FileStore) -> None:
    files.put(allocation(PCI_A))
    (files.vfs_dir / f"{PCI_B}.json").write_text("{not json")
    with pytest.raises(CNIError):
        files.all()
    found, bad = files.scan()
    assert [a.vf_pci for a in found] == [PCI_A]
    assert list(bad) == [PCI_B] and "is unreadable" in bad[PCI_B]


def test_an_oversized_record_is_refused(files: FileStore) -> None:
    files.put(allocation())
    path = files.vfs_dir / f"{PCI_A}.json"
    path.write_bytes(allocation().to_json().encode().ljust(70 * 1024))
    refused(files, path, "unreadable")


def test_a_symlinked_record_is_not_followed(files: FileStore, tmp_path: Path) -> None:
    files.put(allocation())
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(allocation(container="someone else").to_json())
    path = files.vfs_dir / f"{PCI_A}.json"
    path.unlink()
    path.symlink_to(elsewhere)
    refused(files, path, "cannot read")
    # Not a record, yet not free either: an ADD passes the VF over.
    assert files.has(PCI_A)


def test_a_fifo_in_place_of_a_record_is_refused_without_blocking(files: FileStore) -> None:
    files.put(allocation())
    path = files.vfs_dir / f"{PCI_A}.json"
    path.unlink()
    os.mkfifo(path)
    refused(files, path, "not a regular file")
    assert files.has(PCI_A)


@pytest.fixture
def claim_held_elsewhere(files: FileStore) -> Iterator[subprocess.Popen[str]]:
    """Another process holding PCI_A's claim (flock(1), as any flock user would)."""
    files.claim(PCI_B).drop()  # type: ignore[union-attr]  # creates the directories
    holder = subprocess.Popen(
        ["flock", str(files.claims_dir / f"{PCI_A}.lock"), "sh", "-c", "echo held; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    try:
        yield holder
    finally:
        drop_held(holder)


def drop_held(holder: subprocess.Popen[str]) -> None:
    if holder.returncode is None:
        holder.communicate("\n", timeout=60)
        assert holder.returncode == 0


def test_a_claim_another_process_holds_is_refused_and_other_vfs_are_not(
    files: FileStore, claim_held_elsewhere: subprocess.Popen[str]
) -> None:
    assert files.claim(PCI_A, wait=0.2) is None
    other = files.claim(PCI_B)
    assert other is not None
    other.drop()
    drop_held(claim_held_elsewhere)
    claim = files.claim(PCI_A)
    assert claim is not None
    claim.drop()


def test_records_are_0600_in_0700_directories_and_no_temporary_file_stays(files: FileStore) -> None:
    with files.claim(PCI_A):  # type: ignore[union-attr]
        files.put(allocation())
        files.put(allocation(container="ctr2"))
    with files.claim(PCI_B):  # type: ignore[union-attr]
        files.set_aside(SetAside(PCI_B, "no carrier", "", 1.0, 1.0, 1, 61.0))
    assert os.listdir(files.vfs_dir) == [f"{PCI_A}.json"]
    assert os.listdir(files.aside_dir) == [f"{PCI_B}.json"]
    for path in (
        files.vfs_dir / f"{PCI_A}.json",
        files.claims_dir / f"{PCI_A}.lock",
        files.aside_dir / f"{PCI_B}.json",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for directory in (files.root, files.vfs_dir, files.claims_dir, files.aside_dir):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    # The claims are the store's only locks: there is no node-wide lock file.
    assert sorted(os.listdir(files.root)) == ["aside", "claims", "vfs"]


def test_records_outlive_the_store_object(files: FileStore) -> None:
    files.put(allocation(original=original()))
    assert FileStore(files.root).all() == [allocation(original=original())]


def test_ownership_needs_container_ifname_and_network_when_given() -> None:
    alloc = allocation()
    assert alloc.owned_by("ctr1", "net1") and alloc.owned_by("ctr1", "net1", "sriov-net")
    assert not alloc.owned_by("ctr1", "net1", "other-net")
    assert not alloc.owned_by("ctr1", "net2") and not alloc.owned_by("ctr2", "net1")


def test_a_record_of_exactly_the_size_limit_reads_and_one_byte_more_is_refused(files: FileStore) -> None:
    files.put(allocation())
    path = files.vfs_dir / f"{PCI_A}.json"
    path.write_bytes(allocation().to_json().encode().ljust(MAX_RECORD))
    assert files.get(PCI_A) == allocation()
    path.write_bytes(allocation().to_json().encode().ljust(MAX_RECORD + 1))
    refused(files, path, "unreadable")


def test_a_claim_that_cannot_be_opened_is_an_io_error_naming_it(files: FileStore) -> None:
    files.claim(PCI_B).drop()  # type: ignore[union-attr]  # creates the directories
    path = files.claims_dir / f"{PCI_A}.lock"
    path.mkdir()
    with pytest.raises(CNIError) as err:
        files.claim(PCI_A)
    assert err.value.code == Code.IO_FAILURE and str(path) in err.value.msg


def test_a_symlink_planted_at_the_temporary_name_is_not_written_through(files: FileStore, tmp_path: Path) -> None:
    files.put(allocation())
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (files.vfs_dir / f".{PCI_A}.json.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(CNIError) as err:
        files.put(allocation(container="ctr2"))
    assert err.value.code == Code.IO_FAILURE
    assert victim.read_text() == "untouched\n"
    assert files.get(PCI_A) == allocation()


def test_ids_read_no_record(files: FileStore) -> None:
    # An allocation must not depend on reading the records of taken VFs.
    files.put(allocation(PCI_A))
    (files.vfs_dir / f"{PCI_A}.json").write_text("{not json")
    assert set(files.ids()) == {PCI_A}


def test_a_records_rdma_device_survives_the_store() -> None:
    alloc = allocation(original=original())
    alloc.rdma_device, alloc.rdma_index = "mlx5_3", 7
    back = Allocation.from_json(alloc.to_json())
    assert (back.rdma_device, back.rdma_index, back.rdma_soft) == ("mlx5_3", 7, False)
