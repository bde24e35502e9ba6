"""The C library, for the calls Python's os module lacks (setns, unshare, mount, prctl)."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def libc() -> ctypes.CDLL:
    """The process's C library, loaded once, with errno kept for ``ctypes.get_errno``."""
    return ctypes.CDLL(None, use_errno=True)
