from __future__ import annotations

import pytest

from sriov_cni.kernel import cpulist


@pytest.mark.parametrize(
    "text, cpus",
    [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("5", [5]), ("", []), ("3,1-2,2\n", [1, 2, 3])],
)
def test_parse_list(text: str, cpus: list[int]) -> None:
    assert cpulist.parse_list(text) == cpus


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "-1"])
def test_parse_list_rejects(bad: str) -> None:
    with pytest.raises(cpulist.CpuListError):
        cpulist.parse_list(bad)


def test_format_list_collapses_ranges() -> None:
    assert cpulist.format_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert cpulist.format_list([]) == ""


def test_mask_small() -> None:
    assert cpulist.format_mask([0, 1, 2, 3]) == "0000000f"
    assert cpulist.format_mask([]) == "0"


def test_mask_above_32_cpus_uses_comma_groups() -> None:
    assert cpulist.format_mask([40]) == "00000100,00000000"
    assert cpulist.format_mask([0, 63, 64]) == "00000001,80000000,00000001"


def test_parse_mask_reads_kernel_padding() -> None:
    # The kernel pads to its CPU count; leading zero groups mean nothing.
    assert cpulist.parse_mask("00000000,00000100,00000000\n") == [40]
    assert cpulist.parse_mask("f") == [0, 1, 2, 3]
    assert cpulist.parse_mask("0") == []


def test_mask_round_trip_for_many_cpus() -> None:
    cpus = [1, 31, 32, 33, 95, 127, 200]
    assert cpulist.parse_mask(cpulist.format_mask(cpus)) == cpus


def test_parse_mask_rejects_groups_wider_than_32_bits() -> None:
    with pytest.raises(cpulist.CpuListError):
        cpulist.parse_mask("100000000")


def test_spread_wraps_when_more_queues_than_cpus() -> None:
    assert cpulist.spread([2, 3, 5], 0, 7) == [2, 3, 5, 2, 3, 5, 2]
    assert cpulist.spread([2, 3, 5], 4, 2) == [3, 5]


def test_spread_needs_a_cpu() -> None:
    with pytest.raises(cpulist.CpuListError):
        cpulist.spread([], 0, 1)


@pytest.mark.parametrize("n, p", [(0, 1), (1, 1), (2, 2), (3, 4), (2048, 2048), (2049, 4096)])
def test_next_pow2(n: int, p: int) -> None:
    assert cpulist.next_pow2(n) == p
