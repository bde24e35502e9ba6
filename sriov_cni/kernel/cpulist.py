"""CPU sets in the kernel's two text forms: lists (``0-3,8``) and hex masks.

Lists are what ``smp_affinity_list`` and the ``cpulist`` files use; masks
are what ``rps_cpus``, ``xps_cpus`` and ``default_smp_affinity`` use, where
only a hex form exists.  Masks are written in comma-separated 32-bit groups,
most significant first, because the kernel rejects a group wider than 32
bits (``bitmap_parse``); reads are normalised the same way, since the kernel
pads its answer to the machine's CPU count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

_GROUP_BITS = 32


class CpuListError(ValueError):
    pass


def parse_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``; empty text is the empty set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise CpuListError(f"{json.dumps(part)} is not a CPU number or range like 2-5") from None
        if lo < 0 or hi < lo:
            raise CpuListError(f"{json.dumps(part)} is not a CPU range (start must be <= end, both >= 0)")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_list(cpus: Iterable[int]) -> str:
    """The shortest list form: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def format_mask(cpus: Iterable[int]) -> str:
    """Hex mask in 8-digit groups: CPU 40 -> ``"00000100,00000000"``; no CPU -> ``"0"``."""
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    if value == 0:
        return "0"
    groups: list[str] = []
    while value:
        groups.append(f"{value & 0xFFFFFFFF:08x}")
        value >>= _GROUP_BITS
    return ",".join(reversed(groups))


def parse_mask(text: str) -> list[int]:
    """The CPUs of a hex mask as the kernel prints or accepts it (``"ff,00000000"``)."""
    value = 0
    for group in text.strip().split(","):
        group = group.strip()
        if not group:
            continue
        try:
            chunk = int(group, 16)
        except ValueError:
            raise CpuListError(f"{json.dumps(group)} is not a hex CPU mask group") from None
        if chunk >> _GROUP_BITS:
            raise CpuListError(f"{json.dumps(group)} is wider than 32 bits")
        value = (value << _GROUP_BITS) | chunk
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


def spread(cpus: list[int], start: int, count: int) -> list[int]:
    """``count`` CPUs taken round robin from ``cpus`` beginning at position ``start``.

    One CPU per queue, wrapping when there are more queues than CPUs.
    """
    if not cpus:
        raise CpuListError("no CPU left to spread over")
    return [cpus[(start + i) % len(cpus)] for i in range(count)]


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (the kernel rounds RFS table sizes this way)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
