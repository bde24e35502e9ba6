"""A netdev's ethtool settings, read and written through the SIOCETHTOOL ioctl.

What a pod holding NET_ADMIN over its VF can change with ``ethtool`` and
what outlives the VF's move back to the host: the driver keeps its
offloads, ring sizes, channels, coalescing, pause, private flags and FEC
in its own state, which neither a netns move nor a close resets.  Each is
read as a group of plain integers (a JSON-friendly record), compared with
the record, and written back only when it differs.

The ioctl rather than ethtool's genetlink family: it is one system call a
group on a socket of the caller's namespace, needs no family resolution,
and every driver that has a group answers it (the netlink side calls the
same driver callbacks).  A group the driver does not have answers
EOPNOTSUPP and is left out of the reading.  Requests name the netdev, so
they act in this process's network namespace: the host's, at ADD's
snapshot and at DEL's restore.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sriov_cni.kernel.nlerrors import NetlinkError, NotSupported, for_errno

_SIOCETHTOOL = 0x8946
_IFREQ = struct.Struct("16sP")  # struct ifreq: the name, then a pointer to the command's struct
_ETHTOOL_GSSET_INFO = 0x37
_ETHTOOL_GSTRINGS = 0x1B
_ETHTOOL_GFEATURES = 0x3A
_ETHTOOL_SFEATURES = 0x3B
_ETH_SS_FEATURES = 4
_ETH_GSTRING_LEN = 32


@dataclass(frozen=True)
class _Group:
    """A settings group: its get and set commands, its struct's u32 fields after ``cmd``, the ones written back."""

    get: int
    set: int
    fields: int
    settable: slice


# Each struct is ``cmd`` and then u32s.  The settable fields: ring sizes and
# channel counts follow their maxima (which the driver reports and a write
# ignores); coalescing, pause and private flags are all settable; FEC's
# ``fec`` is the configured mode, ``active_fec`` only reported.
_GROUPS = {
    "rings": _Group(0x10, 0x11, 8, slice(4, 8)),  # struct ethtool_ringparam
    "channels": _Group(0x3C, 0x3D, 8, slice(4, 8)),  # struct ethtool_channels
    "coalesce": _Group(0x0E, 0x0F, 22, slice(0, 22)),  # struct ethtool_coalesce
    "pause": _Group(0x12, 0x13, 3, slice(0, 3)),  # struct ethtool_pauseparam
    "private_flags": _Group(0x27, 0x28, 1, slice(0, 1)),  # struct ethtool_value
    "fec": _Group(0x50, 0x51, 3, slice(1, 2)),  # struct ethtool_fecparam
}


class _Socket:
    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def close(self) -> None:
        self._sock.close()

    def call(self, name: str, buf: ctypes.Array[ctypes.c_char], what: str) -> None:
        ifreq = _IFREQ.pack(name.encode(), ctypes.addressof(buf))
        try:
            fcntl.ioctl(self._sock, _SIOCETHTOOL, ifreq)
        except OSError as exc:
            raise for_errno(f"{what} ({name})", exc.errno or errno.EIO) from exc


def _u32s(*values: int) -> ctypes.Array[ctypes.c_char]:
    return ctypes.create_string_buffer(struct.pack(f"={len(values)}I", *values), 4 * len(values))


def _unpack(buf: ctypes.Array[ctypes.c_char], count: int, offset: int = 0) -> tuple[int, ...]:
    return struct.unpack_from(f"={count}I", buf.raw, offset)


def _group(sock: _Socket, name: str, group: _Group) -> list[int]:
    buf = _u32s(group.get, *([0] * group.fields))
    sock.call(name, buf, f"reading {name}'s ethtool settings")
    return list(_unpack(buf, group.fields, 4))


def _feature_names(sock: _Socket, name: str) -> list[str]:
    # struct ethtool_sset_info: cmd, reserved, the sets asked for, then one u32 per set found.
    info = _u32s(_ETHTOOL_GSSET_INFO, 0, 1 << _ETH_SS_FEATURES, 0, 0, 0)
    sock.call(name, info, "counting features")
    count = _unpack(info, 1, 16)[0]
    # struct ethtool_gstrings: cmd, string set, count, then the strings.
    strings = ctypes.create_string_buffer(
        struct.pack("=3I", _ETHTOOL_GSTRINGS, _ETH_SS_FEATURES, count), 12 + count * _ETH_GSTRING_LEN
    )
    sock.call(name, strings, "naming features")
    raw = strings.raw[12:]
    return [raw[i * _ETH_GSTRING_LEN : (i + 1) * _ETH_GSTRING_LEN].split(b"\0", 1)[0].decode() for i in range(count)]


def _features(sock: _Socket, name: str) -> tuple[list[str], list[int], list[int]]:
    """The feature names, and per 32-feature block the changeable and the requested bits."""
    names = _feature_names(sock, name)
    blocks = (len(names) + 31) // 32
    # struct ethtool_gfeatures: cmd, size (blocks), then per block available, requested, active, never_changed.
    buf = ctypes.create_string_buffer(struct.pack("=2I", _ETHTOOL_GFEATURES, blocks), 8 + 16 * blocks)
    sock.call(name, buf, "reading features")
    words = _unpack(buf, 4 * blocks, 8)
    return names, list(words[0::4]), list(words[1::4])


def read(name: str) -> dict[str, Any]:
    """The netdev's ethtool settings: each group its driver has, and the changeable features as requested."""
    sock = _Socket()
    try:
        return _read(sock, name)
    finally:
        sock.close()


def _read(sock: _Socket, name: str, groups: Iterable[str] = _GROUPS) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for key in groups:
        group = _GROUPS[key]
        try:
            state[key] = _group(sock, name, group)
        except NotSupported:
            continue
    names, changeable, requested = _features(sock, name)
    state["features"] = {
        feature: bool(requested[i // 32] >> (i % 32) & 1)
        for i, feature in enumerate(names)
        if feature and changeable[i // 32] >> (i % 32) & 1
    }
    return state


def differences(current: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """What differs from the record, one entry per setting, as "what: now (recorded)"."""
    out = []
    for key, want in recorded.items():
        have = current.get(key)
        if key == "features":
            have = have or {}
            out += [f"{f}: {_onoff(have.get(f))} ({_onoff(on)})" for f, on in want.items() if have.get(f) != on]
        elif key in _GROUPS and (have is None or have[_GROUPS[key].settable] != want[_GROUPS[key].settable]):
            out.append(f"{key.replace('_', ' ')}: {have} ({want})")
    return out


def _onoff(value: bool | None) -> str:
    return "?" if value is None else "on" if value else "off"


def restore(name: str, recorded: dict[str, Any]) -> list[str]:
    """Write back each recorded group that differs, after one reading; returns what could not be.

    A pod that changed nothing costs this one reading, of the groups the
    record has only: each request waits for the RTNL lock, which a busy node
    holds often.
    """
    sock = _Socket()
    try:
        current = _read(sock, name, [key for key in recorded if key in _GROUPS])
        failures = []
        for key, want in recorded.items():
            try:
                if key == "features":
                    _restore_features(sock, name, current["features"], want)
                elif key in _GROUPS:
                    group = _GROUPS[key]
                    have = current.get(key)
                    if have is not None and have[group.settable] != want[group.settable]:
                        sock.call(name, _u32s(group.set, *want), f"restoring {key.replace('_', ' ')}")
            except NetlinkError as exc:
                failures.append(str(exc))
        return failures
    finally:
        sock.close()


def _restore_features(sock: _Socket, name: str, current: dict[str, bool], recorded: dict[str, bool]) -> None:
    changed = {f: on for f, on in recorded.items() if f in current and current[f] != on}
    if not changed:
        return
    names = _feature_names(sock, name)
    blocks = (len(names) + 31) // 32
    valid, requested = [0] * blocks, [0] * blocks
    for i, feature in enumerate(names):
        if feature in changed:
            valid[i // 32] |= 1 << (i % 32)
            requested[i // 32] |= int(changed[feature]) << (i % 32)
    # struct ethtool_sfeatures: cmd, size, then per block the bits to change and their values.
    pairs = [word for block in zip(valid, requested, strict=True) for word in block]
    sock.call(name, _u32s(_ETHTOOL_SFEATURES, blocks, *pairs), f"restoring features {', '.join(changed)}")
