"""One netlink socket's requests and answers: the core under rtnetlink (:mod:`rtnl`) and RDMA netlink (:mod:`rdma`).

What both families share: struct nlmsghdr and struct nlattr, sequence
numbers that match answers to their request (skipping the tail of one an
exception abandoned), answers longer than the receive buffer, and the
kernel's error answer with the text of its extended ack ("Nexthop has
invalid gateway"), which says more than the errno.  What a request's body
is, and what an error becomes, is the family's module's.

Only the standard library: importing it does not load pyroute2.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator

HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
ATTR = struct.Struct("=HH")  # struct nlattr
_ERRNO = struct.Struct("=i")  # the first field of struct nlmsgerr, and NLMSG_DONE's payload
ATTR_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
# In an error answer's flags: the echoed request is only its header
# (NETLINK_CAP_ACK), and attributes follow it (NETLINK_EXT_ACK).
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200
NLMSGERR_ATTR_MSG = 1
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11

# The kernel answers a dump in datagrams of at most 32 KiB, but one answer
# (a PF's link with its VF list) may be longer: the buffer grows to what a
# peek reports.
BUFSIZE = 65536

# What a family makes of an error answer: (errno, the nlmsgerr payload, the
# answer's flags) -> the exception to raise.
Refusal = Callable[[int, bytes, int], Exception]


def align(n: int) -> int:
    return (n + 3) & ~3


def attributes(data: bytes | memoryview, offset: int = 0) -> dict[int, list[memoryview]]:
    """The payloads of the attributes in ``data`` from ``offset`` on, by type (flag bits cleared), in order."""
    view = memoryview(data)
    found: dict[int, list[memoryview]] = {}
    while offset + ATTR.size <= len(view):
        length, kind = ATTR.unpack_from(view, offset)
        if length < ATTR.size or offset + length > len(view):
            break
        found.setdefault(kind & ATTR_TYPE_MASK, []).append(view[offset + ATTR.size : offset + length])
        offset += align(length)
    return found


def ack_text(payload: bytes, flags: int) -> str:
    """The kernel's extended-ack message in an error answer's ``payload`` (after its header); "" when it sent none."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    # After the error code, the echoed request: its header only when capped.
    echoed = HEADER.size if flags & NLM_F_CAPPED else HEADER.unpack_from(payload, 4)[0]
    raw = attributes(payload, 4 + align(echoed)).get(NLMSGERR_ATTR_MSG)
    return bytes(raw[-1]).split(b"\0", 1)[0].decode(errors="replace") if raw else ""


class Socket:
    """A netlink socket whose requests are made one at a time, error answers carrying the kernel's text."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        self._sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        self._seq = 0
        self._buf = bytearray(BUFSIZE)

    def close(self) -> None:
        self._sock.close()

    def next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def send(self, request: bytes) -> None:
        self._sock.send(request)

    def answers(self, seq: int, refused: Refusal) -> Iterator[tuple[int, int, bytes]]:
        """(type, flags, whole message) of each answer to request ``seq``, its NLMSG_DONE last; none for an ack.

        An error answer (or a dump's NLMSG_DONE carrying one) raises what
        ``refused`` makes of it.  A caller that stops early leaves the rest
        queued; the next request's reading skips it by its sequence number.
        """
        while True:
            data = self._receive()
            offset = 0
            while offset + HEADER.size <= len(data):
                length, kind, flags, got_seq, _ = HEADER.unpack_from(data, offset)
                if length < HEADER.size:
                    break
                start, offset = offset, offset + align(length)
                if got_seq != seq:
                    continue  # the tail of an earlier request abandoned by an exception
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    payload = data[start + HEADER.size : start + length]
                    code = _ERRNO.unpack_from(payload)[0] if len(payload) >= _ERRNO.size else 0
                    if code < 0:
                        raise refused(-code, payload, flags)
                    if kind == NLMSG_DONE:
                        yield kind, flags, data[start : start + length]
                    return
                yield kind, flags, data[start : start + length]

    def _receive(self) -> bytes:
        size = self._sock.recv_into(self._buf, 0, socket.MSG_PEEK | socket.MSG_TRUNC)
        if size > len(self._buf):
            self._buf = bytearray(size)
        size = self._sock.recv_into(self._buf)
        return bytes(self._buf[:size])
