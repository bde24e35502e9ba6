"""The work of a call grows with its configuration linearly, not with its square.

Counted, not timed: each place that finds the range holding an address asks
``Range.contains``, so the number of those questions is the work, the same
on any machine.  A network of ten times the ranges may ask ten times as many
(every range is parsed and checked once); asking each range about each
address, as a scan does, would ask a hundred times as many.  Real: the
handlers through dispatch on a disk store in a temporary directory; the
counter wraps the real method.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import pytest

from sriov_cni.cni import IPAddress
from sriov_cni.ipam import allocator, config, store
from tests.ipam.ipamtypes import Invoke, MakeConf
from tests.support.fakes import MemoryReservationStore

SMALL, LARGE = 50, 500
# Linear work: LARGE/SMALL.  A scan per address: its square.
GROWTH_BOUND = 1.5 * LARGE / SMALL


def slash30s(n: int) -> Iterator[dict[str, str]]:
    base = int(ipaddress.ip_address("10.0.0.0"))
    for i in range(n):
        yield {"subnet": f"{ipaddress.ip_address(base + 4 * i)}/30"}


@pytest.fixture
def contains_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times ``Range.contains`` has been asked, in a list of one counter."""
    count = [0]
    real = config.Range.contains

    def counting(self: config.Range, ip: IPAddress) -> bool:
        count[0] += 1
        return real(self, ip)

    monkeypatch.setattr(config.Range, "contains", counting)
    return count


def _every_command(cni: Invoke, conf: dict[str, Any], sets: int, count: list[int]) -> dict[str, int]:
    """Questions asked by each command of one attachment's life; checks each answer too."""
    asked: dict[str, int] = {}
    for step, command in enumerate(("ADD", "ADD again", "CHECK", "STATUS", "DEL")):
        before = count[0]
        outcome = cni(command.split()[0], conf, cid="c1")
        asked[command] = count[0] - before
        if step < 2:
            # One address per range set, the same ones when repeated.
            assert len(outcome.addresses()) == sets
        elif command == "STATUS" and sets > 1:
            # Every /30 hands out one address, now taken: exhausted.
            assert outcome.code == 50 and "is exhausted" in outcome.msg, outcome.out
        else:
            assert outcome.rc == 0, outcome.out
    return asked


@pytest.mark.parametrize("shape", ["many sets", "one set of many ranges"])
def test_ranges_are_asked_about_linearly_many_times(
    cni: Invoke, netconf: MakeConf, contains_calls: list[int], shape: str
) -> None:
    def conf(n: int) -> dict[str, Any]:
        ranges = list(slash30s(n))
        return netconf([[r] for r in ranges] if shape == "many sets" else [ranges], version="1.1.0")

    small = _every_command(cni, conf(SMALL), SMALL if shape == "many sets" else 1, contains_calls)
    large = _every_command(cni, conf(LARGE), LARGE if shape == "many sets" else 1, contains_calls)
    for command in small:
        assert large[command] <= GROWTH_BOUND * max(small[command], 1), (command, small, large)


def test_requested_addresses_are_found_without_a_scan(
    cni: Invoke, netconf: MakeConf, contains_calls: list[int]
) -> None:
    asked = []
    for n in (SMALL, LARGE):
        ranges = list(slash30s(n))
        # One address asked for in every range set: each found by one lookup.
        wanted = [str(ipaddress.ip_address(r["subnet"].split("/")[0]) + 2) for r in ranges]
        conf = {**netconf([[r] for r in ranges]), "runtimeConfig": {"ips": wanted}}
        before = contains_calls[0]
        got = cni("ADD", conf, cid="c1").addresses()
        asked.append(contains_calls[0] - before)
        assert got == [f"{ip}/30" for ip in wanted]
        assert cni("DEL", conf, cid="c1").rc == 0
    assert asked[1] <= GROWTH_BOUND * asked[0], asked


def test_full_range_sets_share_one_listing_of_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # Five range sets of four addresses, all but the last of each taken by
    # others; a probe limit of one sends every set to the listing.
    sets = [[{"subnet": f"10.0.{i}.0/29"}] for i in range(5)]
    cfg = config.load({"name": "net", "ipam": {"dataDir": "/unused", "ranges": sets}})
    memory = MemoryReservationStore()
    with memory.locked():
        for i in range(5):
            for host in range(2, 6):
                memory.reserve(ipaddress.ip_address(f"10.0.{i}.{host}"), store.Owner(f"other{i}{host}", "eth0"))
    listings = [0]
    real = memory.reserved

    def counted() -> Any:
        listings[0] += 1
        return real()

    monkeypatch.setattr(memory, "reserved", counted)
    got = allocator.allocate(memory, cfg, store.Owner("c1", "eth0"), {}, probe_limit=1)
    assert [str(a.ip) for a in got] == [f"10.0.{i}.6" for i in range(5)]
    assert listings[0] == 1
