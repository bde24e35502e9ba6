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
same way; :class:`Refused`, the one raised here, carries the kernel's
extended-ack text besides.  The socket, the framing and the matching of
answers are :mod:`sriov_cni.kernel.nlcore`'s, which RDMA netlink shares.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_GETROUTE, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from sriov_cni.kernel import nlcore
from sriov_cni.kernel.nlcore import NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST

_HEADER = nlcore.HEADER
HEADER_SIZE = _HEADER.size
_NETLINK_ROUTE = 0
# A dump the kernel reports as interrupted (the table changed under it) is
# read again; one that never settles fails rather than loop.
_DUMP_ATTEMPTS = 5

# What a GET or a dump answers with.
_ANSWERS = (RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE)
_GETS = (RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE)
_NLA = nlcore.ATTR


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


class Refused(NetlinkError):  # type: ignore[misc]
    """The kernel's error answer: pyroute2's ``NetlinkError`` with its errno, and its extended-ack text (``ack``)."""

    def __init__(self, code: int, ack: str) -> None:
        super().__init__(code, ack or None)
        self.ack = ack


def _refused(code: int, payload: bytes, flags: int) -> Refused:
    return Refused(code, nlcore.ack_text(payload, flags))


class Rtnl(nlcore.Socket):
    """One rtnetlink socket and the requests made on it, one at a time."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        super().__init__(sock or socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE))

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
        seq = self.next_seq()
        dump = bool(flags & NLM_F_DUMP)
        get = msg_type in _GETS
        self.send(encode(msg, msg_type, NLM_F_REQUEST | flags | (0 if get else NLM_F_ACK), seq))
        answers: list[bytes] = []
        interrupted = False
        for kind, mflags, answer in self.answers(seq, _refused):
            if mflags & NLM_F_DUMP_INTR:
                interrupted = True
            if kind not in _ANSWERS:
                continue
            answers.append(answer)
            if get and not dump:
                break
        return answers, interrupted


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
    if offset is None:
        offset = _ATTRS_AT[_HEADER.unpack_from(data)[1]]
    return nlcore.attributes(data, offset)
