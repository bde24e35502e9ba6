"""The ReservationStore contract (one test, both implementations), the disk layout, and
the allocator's candidate order and probing, checked on the fake."""

from __future__ import annotations

import ipaddress
import stat
from collections.abc import Collection
from pathlib import Path

import pytest

from sriov_cni.cni import IPAddress
from sriov_cni.ipam import allocator, config
from sriov_cni.ipam.store import DiskStore, Owner, ReservationStore
from tests.support.fakes import MemoryReservationStore

A = Owner("a", "eth0")
B = Owner("b", "net1")
IP1 = ipaddress.ip_address("10.0.0.5")
IP2 = ipaddress.ip_address("2001:db8::5")


@pytest.fixture(params=["disk", "memory"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> ReservationStore:
    if request.param == "disk":
        return DiskStore(str(tmp_path / "data"), "net")
    return MemoryReservationStore()


def test_store_contract(any_store: ReservationStore) -> None:
    s = any_store
    assert not s.exists()
    assert s.owner_of(IP1) is None and list(s.reservations()) == [] and IP1 not in s.reserved()
    with s.locked():
        assert s.reserve(IP1, A)
        assert not s.reserve(IP1, B)
        assert s.reserve(IP2, B)
        s.set_last_reserved(0, IP1)
        s.set_last_reserved(1, IP2)
        s.set_hint(A, [IP1, IP2])
        s.set_hint(B, [IP2])
    assert s.exists()
    assert s.owner_of(IP1) == A and s.owner_of(IP2) == B
    assert sorted(s.reservations(), key=str) == [(IP1, A), (IP2, B)]
    reserved = s.reserved()
    assert IP1 in reserved and IP2 in reserved and ipaddress.ip_address("10.0.0.6") not in reserved
    assert sorted(reserved, key=str) == [IP1, IP2] and len(reserved) == 2
    assert (s.last_reserved(0), s.last_reserved(1), s.last_reserved(2)) == (IP1, IP2, None)
    assert s.hint(A) == [IP1, IP2] and s.hint(Owner("c", "eth0")) == []
    assert sorted(s.hinted(), key=str) == sorted([A, B], key=str)
    with s.locked():
        s.release(IP1)
        s.release(IP1)  # releasing twice is fine
        s.set_hint(A, [])
    assert s.owner_of(IP1) is None and IP1 not in s.reserved()
    assert s.hint(A) == [] and s.hinted() == [B]


def test_fake_refuses_writes_outside_the_lock() -> None:
    with pytest.raises(RuntimeError, match="outside locked"):
        MemoryReservationStore().reserve(IP1, A)


def test_disk_layout_is_host_locals(tmp_path: Path) -> None:
    s = DiskStore(str(tmp_path / "data"), "net")
    with s.locked():
        s.reserve(IP1, A)
        s.reserve(IP2, B)
        s.set_last_reserved(0, IP1)
    net = tmp_path / "data" / "net"
    assert stat.S_IMODE(net.stat().st_mode) == 0o755
    assert (net / "10.0.0.5").read_bytes() == b"a\r\neth0"
    assert (net / "2001:db8::5").read_bytes() == b"b\r\nnet1"
    assert stat.S_IMODE((net / "10.0.0.5").stat().st_mode) == 0o600
    assert (net / "last_reserved_ip.0").read_bytes() == b"10.0.0.5"
    assert (net / "lock").exists()


def test_owner_decoding_accepts_legacy_and_padded_content() -> None:
    assert Owner.decode(b"abc") == Owner("abc", None)
    assert Owner.decode(b" abc\r\neth0\n") == Owner("abc", "eth0")
    legacy = Owner("abc", None)
    assert legacy.is_claimed_by(Owner("abc", "net1")) and not legacy.is_claimed_by(Owner("abd", "net1"))
    assert not Owner("abc", "eth0").is_claimed_by(Owner("abc", "net1"))


def _set(ranges: list[dict[str, str]]) -> config.RangeSet:
    conf = {"name": "n", "ipam": {"ranges": [ranges]}}
    return config.load(conf).range_sets[0]


def test_candidates_start_after_last_wrap_and_end_with_it() -> None:
    rset = _set(
        [
            {"subnet": "10.0.0.0/29"},  # .2-.6 (gateway .1)
            {"subnet": "10.0.1.0/30", "rangeStart": "10.0.1.1", "gateway": "10.0.1.2"},  # .1
        ]
    )
    order = [str(a.ip) for a in allocator.candidates(rset, ipaddress.ip_address("10.0.0.4"))]
    assert order == ["10.0.0.5", "10.0.0.6", "10.0.1.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    fresh = [str(a.ip) for a in allocator.candidates(rset, None)]
    assert fresh == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.1.1"]
    # A last address outside the set (the config changed) restarts at the beginning.
    assert [str(a.ip) for a in allocator.candidates(rset, ipaddress.ip_address("10.9.9.9"))] == fresh


def test_explicit_network_and_broadcast_in_the_window_are_skipped() -> None:
    rset = _set([{"subnet": "10.0.0.0/29", "rangeStart": "10.0.0.0", "rangeEnd": "10.0.0.7", "gateway": "10.0.0.6"}])
    assert [str(a.ip) for a in allocator.candidates(rset, None)] == [f"10.0.0.{i}" for i in range(1, 6)]
    assert rset.capacity() == 5


class CountingStore(MemoryReservationStore):
    def __init__(self) -> None:
        super().__init__()
        self.probes = 0
        self.listings = 0

    def reserve(self, ip: IPAddress, owner: Owner) -> bool:
        self.probes += 1
        return super().reserve(ip, owner)

    def reserved(self) -> Collection[IPAddress]:
        self.listings += 1
        return super().reserved()


def test_a_long_run_of_taken_addresses_costs_one_listing() -> None:
    cfg = config.load({"name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/24"}]]}})
    s = CountingStore()
    with s.locked():
        for i in range(2, 200):  # .2-.199 taken, .200 onwards free
            s.ips[ipaddress.ip_address(f"10.0.0.{i}")] = B
    got = allocator.allocate(s, cfg, A, {}, probe_limit=8)
    assert str(got[0].ip) == "10.0.0.200"
    # 8 probes, one listing, then a single probe at the first unlisted address.
    assert (s.probes, s.listings) == (9, 1)
    assert s.last[0] == got[0].ip and s.hints[A] == [got[0].ip]


def test_probing_without_listing_when_free_addresses_are_near() -> None:
    cfg = config.load({"name": "n", "ipam": {"ranges": [[{"subnet": "10.0.0.0/16"}]]}})
    s = CountingStore()
    with s.locked():
        for i in range(2, 40):
            s.ips[ipaddress.ip_address(f"10.0.0.{i}")] = B
    assert str(allocator.allocate(s, cfg, A, {})[0].ip) == "10.0.0.40"
    assert (s.probes, s.listings) == (39, 0)
