"""rtnetlink's announcements in this process's network namespace: a link arrived or changed, a namespace died.

When a pod's network namespace dies, the kernel moves each physical netdev
in it (a VF's among them) back to the initial namespace, which announces
it there as a new link (RTM_NEWLINK); and the namespace's id in the host,
which the kernel gave it when a link moved in, is withdrawn (RTM_DELNSID).
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
        """Read everything waiting; whether a link arrived or changed, or a namespace's id was withdrawn."""
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
                seen = seen or kind in (RTM_NEWLINK, RTM_DELNSID)
                if length < _HEADER.size:
                    break
                offset += (length + 3) & ~3
