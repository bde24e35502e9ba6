"""rtnetlink's announcements in this process's network namespace: a link arrived or changed, a namespace died.

When a pod's network namespace dies, the kernel moves each physical netdev
in it (a VF's among them) back to the initial namespace, which announces
it there as a new link (RTM_NEWLINK whose ``ifi_change`` is all ones, as
for a link registered there); and the namespace's id in the host, which
the kernel gave it when a link moved in, is withdrawn (RTM_DELNSID).  A
link's other changes (up, down, renamed, carrier) are not announced to the
listener: every ADD and DEL makes several, and a sweep for each cost a
busy node's pods their first packets' CPU.
A VF on a DPDK driver has no netdev and announces nothing.  Only the
headers are read: what arrived is looked up by whoever listens, so a lost
announcement (the socket's buffer overflowed) is reported as one that came.
"""

from __future__ import annotations

import errno
import socket
import struct

_RTMGRP_LINK = 0x1
_RTNLGRP_NSID = 28
_SOL_NETLINK = 270
_NETLINK_ADD_MEMBERSHIP = 1
RTM_NEWLINK = 16
RTM_DELNSID = 89
_HEADER = struct.Struct("=IHHII")
# ifinfomsg after the header: family, pad, type, index, flags, change.
_IFINFO = struct.Struct("=BxHiII")
_ARRIVED = 0xFFFFFFFF


class LinkEvents:
    """A non-blocking socket that receives the namespace's link and namespace-id announcements."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.sock.bind((0, _RTMGRP_LINK))
            self.sock.setsockopt(_SOL_NETLINK, _NETLINK_ADD_MEMBERSHIP, _RTNLGRP_NSID)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def drain(self) -> bool:
        """Read everything waiting; whether a link arrived, or a namespace's id was withdrawn."""
        seen = False
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return seen
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                seen = True  # announcements were dropped: any of them may have mattered
                continue
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                seen = seen or kind == RTM_DELNSID or (kind == RTM_NEWLINK and _arrival(data, offset, length))
                if length < _HEADER.size:
                    break
                offset += (length + 3) & ~3


def _arrival(data: bytes, offset: int, length: int) -> bool:
    """Whether the RTM_NEWLINK at ``offset`` announces a link new to the namespace, not a change of one."""
    if length < _HEADER.size + _IFINFO.size:
        return True  # not a link message as this kernel writes them: look rather than miss one
    change: int = _IFINFO.unpack_from(data, offset + _HEADER.size)[4]
    return change == _ARRIVED
