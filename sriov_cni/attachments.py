"""GC's list of attachments still in use, read the same way by ``sriov`` and ``sriov-ipam``.

GC releases everything of a network that is *not* listed, so a list that
cannot be read must stop GC before anything is released: a value that is
not a list (``null``, ``false``, ``0``, ``""``, ``{}``) or an entry without
a non-empty ``containerID`` and ``ifname`` is refused with code 7.  Only an
absent key means that no attachment is valid: ``cnitool gc`` sends no list
once it has deleted every cached attachment itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sriov_cni.cni import CNIError, Code

# libcni sends both with the same value: the spec's 1.1.0 text named the key
# "cni.dev/attachments" until an erratum renamed it.
KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


def _got(value: Any) -> str:
    text = json.dumps(value)
    shown = text if len(text) <= 60 else text[:57] + "..."
    return f"got {shown}; GC released nothing"


def valid_attachments(conf: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """``(containerID, ifname)`` of every attachment GC must keep."""
    key = next((k for k in KEYS if k in conf), None)
    if key is None:
        return frozenset()
    raw = conf[key]
    if not isinstance(raw, list):
        raise CNIError(
            Code.INVALID_CONFIG,
            f"{key} must be a list of {{containerID, ifname}} objects",
            _got(raw),
        )
    out = set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise CNIError(
                Code.INVALID_CONFIG,
                f"{key}[{i}] must be an object with containerID and ifname",
                _got(entry),
            )
        for field in ("containerID", "ifname"):
            value = entry.get(field)
            if not isinstance(value, str) or not value:
                raise CNIError(
                    Code.INVALID_CONFIG,
                    f"{key}[{i}].{field} must be a non-empty string",
                    _got(value),
                )
        out.add((str(entry["containerID"]), str(entry["ifname"])))
    return frozenset(out)
