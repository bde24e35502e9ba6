"""Synchronous rtnetlink requests on a plain blocking socket, by pyroute2's tables.

pyroute2's message classes (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``) and
their attribute tables describe every request and answer; this module
writes the requests from them (:func:`encode`), sends them, and receives and
matches the answers.  pyroute2 0.9's ``IPRoute`` runs an asyncio loop under
every synchronous call, which costs several times the encoding, the
kernel's work and the decoding together; a CNI call makes dozens of
requests.

Answers come back as the kernel sent them.  A link's answer carries some
fifty attributes (a PF's, every VF's too), and pyroute2 builds an object
for each of them: 0.5 ms a link, sixteen times what reading the handful a
caller needs costs (:func:`attributes`, with the attribute numbers taken
from pyroute2's tables by :func:`numbers`).  :func:`decoded` gives the
pyroute2 object where a rarely used path wants it.

A failed request raises pyroute2's ``NetlinkError`` with the kernel's errno,
as ``IPRoute`` did, so :func:`sriov_cni.kernel.links.translate` maps it the
same way.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
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
HEADER_SIZE = _HEADER.size
_ERRNO = struct.Struct("=i")  # the first field of struct nlmsgerr, and NLMSG_DONE's payload
_NETLINK_ROUTE = 0
# The kernel answers a dump in datagrams of at most 32 KiB, but one link's
# answer (a PF's VF list) may be longer: the buffer grows to what a peek reports.
_BUFSIZE = 65536
# A dump the kernel reports as interrupted (the table changed under it) is
# read again; one that never settles fails rather than loop.
_DUMP_ATTEMPTS = 5

# What a GET or a dump answers with.
_ANSWERS = (RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE)
_GETS = (RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE)
_NLA = struct.Struct("=HH")  # struct nlattr
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER


def _attrs_offset(cls: type[Any]) -> int:
    """Where the attributes start: after struct nlmsghdr and the family header (``cls.fields``), aligned."""
    family = struct.calcsize("=" + "".join(fmt for _, fmt in cls.fields))
    return _HEADER.size + ((family + 3) & ~3)


# By answer type.
_ATTRS_AT = {
    RTM_NEWLINK: _attrs_offset(ifinfmsg),
    RTM_NEWADDR: _attrs_offset(ifaddrmsg),
    RTM_NEWROUTE: _attrs_offset(rtmsg),
}


# A struct's fields by its pyroute2 class (see :class:`Message`).
Structs = Mapping[type[Any], tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Message:
    """A request body: pyroute2 message class ``cls``, its header ``fields``, its ``attrs``.

    Attributes are ``(name, value)`` pairs as pyroute2 takes them (a nested
    attribute's value is ``{"attrs": [...]}``, a struct's a dict of its
    fields), and :func:`encode` writes them by the types pyroute2's tables
    give their names.  pyroute2's own encoder builds an object per
    attribute and field: about a tenth of an ADD in the TCG guest.

    ``structs`` gives a struct's fields, by its pyroute2 class, where
    pyroute2's table has them wrong: for this message only, since pyroute2's
    tables are shared with every other user of pyroute2 in the process.
    """

    cls: type[Any]
    fields: dict[str, int]
    attrs: list[tuple[str, Any]]
    structs: Structs = field(default_factory=dict)


def message(
    cls: type[Any],
    fields: dict[str, int],
    attrs: list[tuple[str, Any]],
    structs: Structs | None = None,
) -> Message:
    """A request body of class ``cls`` (the netlink header is filled in by :meth:`Rtnl.request`)."""
    return Message(cls, fields, attrs, structs or {})


def _pack_struct(fields: tuple[tuple[str, str], ...], values: dict[str, Any]) -> bytes:
    out = bytearray()
    for name, fmt in fields:
        value = values.get(name, 0)
        if fmt == "x":
            out += b"\0"
        elif fmt == "32B":  # a hardware address field (struct ifla_vf_mac), zero-padded
            out += bytes.fromhex(str(value).replace(":", "")).ljust(32, b"\0")
        else:
            out += struct.pack(fmt if fmt[0] in "<>!" else "=" + fmt, value)
    return bytes(out)


def _ip(value: Any) -> bytes:
    text = str(value)
    return socket.inet_pton(socket.AF_INET6 if ":" in text else socket.AF_INET, text)


# pyroute2 attribute types this module writes, by the name its tables use.
_SCALARS: dict[str, Any] = {
    "asciiz": lambda v: str(v).encode() + b"\0",
    "uint32": lambda v: struct.pack("=I", v),
    "netns_fd": lambda v: struct.pack("=I", v),
    "xdp_fd": lambda v: struct.pack("=i", v),
    "xdp_flags": lambda v: struct.pack("=I", v),
    "l2addr": lambda v: bytes.fromhex(str(v).replace(":", "")),
    "ipaddr": _ip,
    "target": _ip,
}


def _attrs(cls: type[Any], attrs: list[tuple[str, Any]], structs: Structs) -> bytes:
    types = _types(cls)
    out = bytearray()
    for name, value in attrs:
        number, kind = types[name]
        if kind in _SCALARS:
            payload = _SCALARS[kind](value)
        else:
            nested = getattr(cls, kind)
            # The table's flags: NLA_F_NESTED where the kernel checks for it
            # (the link property list).
            number |= getattr(nested, "nla_flags", 0)
            if getattr(nested, "nla_map", None):
                payload = _attrs(nested, value["attrs"], structs)
            else:
                payload = _pack_struct(structs.get(nested, nested.fields), value)
        out += _NLA.pack(_NLA.size + len(payload), number) + payload
        out += bytes(-len(out) % 4)
    return bytes(out)


_TYPES: dict[type[Any], dict[str, tuple[int, str]]] = {}


def _types(cls: type[Any]) -> dict[str, tuple[int, str]]:
    """(number, pyroute2 type) by attribute name, from ``cls``'s table."""
    if cls not in _TYPES:
        table: dict[str, tuple[int, str]] = {}
        for position, entry in enumerate(cls.nla_map):
            if isinstance(entry[0], int):
                table[entry[1]] = (entry[0], entry[2])
            else:
                table[entry[0]] = (position, entry[1])
        _TYPES[cls] = table
    return _TYPES[cls]


def encode(msg: Message, msg_type: int, flags: int, seq: int) -> bytes:
    """The whole request: struct nlmsghdr, the family header, the attributes."""
    body = _pack_struct(msg.cls.fields, msg.fields)
    body += bytes(-len(body) % 4) + _attrs(msg.cls, msg.attrs, msg.structs)
    return _HEADER.pack(_HEADER.size + len(body), msg_type, flags, seq, 0) + body


class Rtnl:
    """One rtnetlink socket and the requests made on it, one at a time."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self._sock = sock or socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
        self._seq = 0
        self._buf = bytearray(_BUFSIZE)

    def close(self) -> None:
        self._sock.close()

    def request(self, msg_type: int, msg: Message, flags: int = 0) -> list[bytes]:
        """Send one request and return the answers, each a whole message.

        A change (``flags`` without NLM_F_DUMP) is sent with NLM_F_ACK, so
        the kernel's verdict is awaited; a GET returns its one answer, a
        dump every message up to NLMSG_DONE.
        """
        for _ in range(_DUMP_ATTEMPTS):
            answers, interrupted = self._exchange(msg_type, msg, flags)
            if not interrupted:
                return answers
        raise NetlinkError(errno.EAGAIN, f"dump of message type {msg_type} kept changing under it")

    def _exchange(self, msg_type: int, msg: Message, flags: int) -> tuple[list[bytes], bool]:
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        dump = bool(flags & NLM_F_DUMP)
        get = msg_type in _GETS
        self._sock.send(encode(msg, msg_type, NLM_F_REQUEST | flags | (0 if get else NLM_F_ACK), seq))
        answers: list[bytes] = []
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
                if kind not in _ANSWERS:
                    continue
                answers.append(data[start : start + length])
                if get and not dump:
                    return answers, interrupted

    def _receive(self) -> bytes:
        size = self._sock.recv_into(self._buf, 0, socket.MSG_PEEK | socket.MSG_TRUNC)
        if size > len(self._buf):
            self._buf = bytearray(size)
        size = self._sock.recv_into(self._buf)
        return bytes(self._buf[:size])


def decoded(cls: type[Any], answer: bytes) -> Any:
    """``answer`` decoded whole by pyroute2's message class ``cls``."""
    msg = cls(answer)
    msg.decode()
    return msg


def numbers(cls: type[Any]) -> dict[str, int]:
    """Attribute numbers by name, from a pyroute2 message or attribute class's table."""
    return {name: number for name, (number, _) in _types(cls).items()}


def attributes(data: bytes | memoryview, offset: int | None = None) -> dict[int, list[memoryview]]:
    """The payloads of the attributes in ``data`` by number, in order.

    ``offset`` None: ``data`` is a whole answer, whose attributes follow its
    family header.  A nested attribute is read from its payload, offset 0.
    """
    view = memoryview(data)
    if offset is None:
        offset = _ATTRS_AT[_HEADER.unpack_from(view)[1]]
    found: dict[int, list[memoryview]] = {}
    while offset + _NLA.size <= len(view):
        length, kind = _NLA.unpack_from(view, offset)
        if length < _NLA.size or offset + length > len(view):
            break
        found.setdefault(kind & _NLA_TYPE_MASK, []).append(view[offset + _NLA.size : offset + length])
        offset += (length + 3) & ~3
    return found
