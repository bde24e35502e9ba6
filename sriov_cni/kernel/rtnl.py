"""Synchronous rtnetlink requests on a plain blocking socket, in pyroute2's wire format.

pyroute2's message classes (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``) encode
requests and decode answers; this module only sends, receives and matches
them.  pyroute2 0.9's ``IPRoute`` runs an asyncio loop under every
synchronous call, which costs several times the encoding, the kernel's work
and the decoding together; a CNI call makes dozens of requests.

A failed request raises pyroute2's ``NetlinkError`` with the kernel's errno,
as ``IPRoute`` did, so :func:`sriov_cni.kernel.links.translate` maps it the
same way.
"""

from __future__ import annotations

import errno
import socket
import struct
from typing import Any

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
)
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_GETROUTE, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_ERRNO = struct.Struct("=i")  # the first field of struct nlmsgerr, and NLMSG_DONE's payload
_NETLINK_ROUTE = 0
# The kernel answers a dump in datagrams of at most 32 KiB, but one link's
# answer (a PF's VF list) may be longer: the buffer grows to what a peek reports.
_BUFSIZE = 65536
# A dump the kernel reports as interrupted (the table changed under it) is
# read again; one that never settles fails rather than loop.
_DUMP_ATTEMPTS = 5

# Answer classes by message type (the RTM_NEW* a GET or dump returns).
_DECODERS: dict[int, type[Any]] = {RTM_NEWLINK: ifinfmsg, RTM_NEWADDR: ifaddrmsg, RTM_NEWROUTE: rtmsg}
_GETS = (RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE)


def message(cls: type[Any], fields: dict[str, int], attrs: list[tuple[str, Any]]) -> Any:
    """A request body of class ``cls`` (header fields are filled in by :meth:`Rtnl.request`)."""
    msg = cls()
    for key, value in fields.items():
        msg[key] = value
    msg["attrs"] = attrs
    return msg


class Rtnl:
    """One rtnetlink socket and the requests made on it, one at a time."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self._sock = sock or socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
        self._seq = 0
        self._buf = bytearray(_BUFSIZE)

    def close(self) -> None:
        self._sock.close()

    def request(self, msg_type: int, msg: Any, flags: int = 0) -> list[Any]:
        """Send one request and return the decoded answers.

        A change (``flags`` without NLM_F_DUMP) is sent with NLM_F_ACK, so
        the kernel's verdict is awaited; a GET returns its one answer, a
        dump every message up to NLMSG_DONE.
        """
        for _ in range(_DUMP_ATTEMPTS):
            answers, interrupted = self._exchange(msg_type, msg, flags)
            if not interrupted:
                return answers
        raise NetlinkError(errno.EAGAIN, f"dump of message type {msg_type} kept changing under it")

    def _exchange(self, msg_type: int, msg: Any, flags: int) -> tuple[list[Any], bool]:
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        dump = bool(flags & NLM_F_DUMP)
        get = msg_type in _GETS
        header = msg["header"]
        header["type"] = msg_type
        header["flags"] = NLM_F_REQUEST | flags | (0 if get else NLM_F_ACK)
        header["sequence_number"] = seq
        header["pid"] = 0
        msg.encode()
        self._sock.send(msg.data)
        answers: list[Any] = []
        interrupted = False
        while True:
            data = self._receive()
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, mflags, mseq, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    break
                start, offset = offset, offset + ((length + 3) & ~3)
                if mseq != seq:
                    continue  # the tail of an earlier request abandoned by an exception
                if mflags & NLM_F_DUMP_INTR:
                    interrupted = True
                if kind == NLMSG_ERROR or kind == NLMSG_DONE:
                    code = _ERRNO.unpack_from(data, start + _HEADER.size)[0] if length >= _HEADER.size + 4 else 0
                    if code < 0:
                        raise NetlinkError(-code)
                    return answers, interrupted
                decoder = _DECODERS.get(kind)
                if decoder is None:
                    continue
                answer = decoder(data[start : start + length])
                answer.decode()
                answers.append(answer)
                if get and not dump:
                    return answers, interrupted

    def _receive(self) -> bytes:
        size = self._sock.recv_into(self._buf, 0, socket.MSG_PEEK | socket.MSG_TRUNC)
        if size > len(self._buf):
            self._buf = bytearray(size)
        size = self._sock.recv_into(self._buf)
        return bytes(self._buf[:size])
