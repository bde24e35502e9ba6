"""The sriov-cni daemon's children as /proc shows them.

Shared by the daemon tests on the host and the shim's tests in the guest.
"""

from __future__ import annotations

import os


def all_children(daemon: int) -> list[int]:
    with open(f"/proc/{daemon}/task/{daemon}/children") as f:
        return [int(pid) for pid in f.read().split()]


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # ended meanwhile
        return None


def running_calls(daemon: int) -> list[int]:
    """The children running a call: each leads its own process group (waiting ones do not)."""
    return [pid for pid in all_children(daemon) if pid == group_of(pid)]
