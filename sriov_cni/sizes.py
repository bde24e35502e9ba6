"""Sizes as Kubernetes writes them (``160Mi``, ``200M``, ``167772160``): the daemon's memory budget, a network's ``rdmaMemlock``."""

from __future__ import annotations

import re

_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi|K|M|G)?")
_UNITS = {None: 1, "K": 1000, "M": 1000**2, "G": 1000**3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
# What the callers print when :func:`parse` refuses a text.
EXPECTED = "give bytes, or a number with Ki, Mi, Gi (or K, M, G)"


def parse(text: str) -> int | None:
    """Bytes from ``text``; None when it is not a size, or is 0."""
    match = _SIZE.fullmatch(text.strip())
    if match is None or int(match[1]) == 0:
        return None
    return int(match[1]) * _UNITS[match[2]]
