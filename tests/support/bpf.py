"""An XDP program without a compiler, for tests that need one attached (pod-side changes DEL must undo).

Real: the kernel's verifier loads it and iproute2 attaches it from its pin
on a bpffs mounted for the test.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

_BPF_PROG_LOAD, _BPF_OBJ_PIN = 5, 6
_BPF_PROG_TYPE_XDP = 6
_SYS_BPF = 321  # x86_64


@pytest.fixture
def xdp_pass(tmp_path: Path) -> Iterator[str]:
    """A pinned XDP program that passes every packet (r0 = XDP_PASS; exit), for `ip link set ... pinned`."""
    libc = ctypes.CDLL(None, use_errno=True)
    insns = struct.pack("=BBhi", 0xB7, 0, 0, 2) + struct.pack("=BBhi", 0x95, 0, 0, 0)
    code, lic = ctypes.create_string_buffer(insns, len(insns)), ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(
        struct.pack("=IIQQ", _BPF_PROG_TYPE_XDP, 2, ctypes.addressof(code), ctypes.addressof(lic)), 128
    )
    fd = libc.syscall(_SYS_BPF, _BPF_PROG_LOAD, attr, 128)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    bpffs = tmp_path / "bpffs"
    bpffs.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
    try:
        path = ctypes.create_string_buffer(str(bpffs / "pass").encode())
        pin = ctypes.create_string_buffer(struct.pack("=QI", ctypes.addressof(path), fd), 128)
        assert libc.syscall(_SYS_BPF, _BPF_OBJ_PIN, pin, 128) == 0, os.strerror(ctypes.get_errno())
        os.close(fd)
        yield str(bpffs / "pass")
    finally:
        subprocess.run(["umount", str(bpffs)], check=True)
