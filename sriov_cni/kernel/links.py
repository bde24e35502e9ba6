"""Link, address and route operations inside one network namespace, over netlink.

:class:`Namespace` makes its requests on a :class:`sriov_cni.kernel.rtnl.Rtnl`
socket; :mod:`sriov_cni.kernel.handles` opens and caches them.  pyroute2's
``NetlinkError`` becomes the exceptions of :mod:`sriov_cni.kernel.nlerrors`
here (:func:`translate`).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink import NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL
from pyroute2.netlink.exceptions import NetlinkError as _PyNetlinkError
from pyroute2.netlink.rtnl import (
    RTM_DELLINK,
    RTM_DELLINKPROP,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWLINKPROP,
    RTM_NEWROUTE,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from sriov_cni.kernel import rtnl
from sriov_cni.kernel.netns import open_netns, run_in_netns
from sriov_cni.kernel.nlerrors import LinkNotFound, for_errno
from sriov_cni.kernel.rtnl import Rtnl, message

# Addresses and routes as the stdlib's types: the kernel layer takes plain
# values, whoever (the CNI result, a test) they come from.
_Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address

IFF_UP = 0x1
IFF_NOARP = 0x80
IFF_PROMISC = 0x100
IFF_ALLMULTI = 0x200
IFF_MULTICAST = 0x1000
# The flags a pod may change and a netns move keeps (see plugin/attach.py's doc), by
# the name OriginalState records them under.
FLAGS = {"promisc": IFF_PROMISC, "allmulti": IFF_ALLMULTI, "multicast": IFF_MULTICAST, "noarp": IFF_NOARP}
# Link settings that are one u32 each, read and written as one attribute,
# by the name OriginalState records them under.  The GSO/GRO limits are
# reported from 5.19 (gso ones earlier) and writable from 5.19/6.0; a
# kernel that does not report one has nothing to restore.
SETTINGS = {
    "txqlen": "IFLA_TXQLEN",
    "group": "IFLA_GROUP",
    "gso_max_size": "IFLA_GSO_MAX_SIZE",
    "gso_max_segs": "IFLA_GSO_MAX_SEGS",
    "gro_max_size": "IFLA_GRO_MAX_SIZE",
}
# XDP attachment modes (IFLA_XDP_ATTACHED) and the flag that detaches each.
_XDP_ATTACHED_DRV, _XDP_ATTACHED_SKB, _XDP_ATTACHED_HW, _XDP_ATTACHED_MULTI = 1, 2, 3, 4
XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE, XDP_FLAGS_HW_MODE = 2, 4, 8
RT_TABLE_MAIN = 254
RTPROT_STATIC = 4
RTN_UNICAST = 1


@contextmanager
def translate(what: str) -> Iterator[None]:
    try:
        yield
    except _PyNetlinkError as exc:
        # The kernel's own explanation, when it gave one (rtnl.Refused).
        raise for_errno(what, int(exc.code), getattr(exc, "ack", "")) from exc


@dataclass(frozen=True)
class LinkInfo:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    carrier: bool
    promisc: bool
    altnames: tuple[str, ...]
    alias: str
    parent_dev: str
    # The raw IFF_* flags, the promiscuity and allmulti counts (a packet
    # socket's membership counts without setting the flag).
    flags: int = 0
    promiscuity: int = 0
    allmulti_count: int = 0
    # SETTINGS's values the kernel reported, by their names there.
    settings: tuple[tuple[str, int], ...] = ()
    # The XDP programs attached, as (detach flag, program id), one per mode.
    xdp: tuple[tuple[int, int], ...] = ()
    # The link this one is stacked on or bound to (IFLA_LINK: a VLAN's or
    # macvlan's lower device, a tunnel's or VXLAN's output device, a veth's
    # peer), when that link is in the same namespace; 0 otherwise.
    lower: int = 0
    # IFLA_MASTER: the bridge, bond, team, VRF or datapath this link is a port of; 0 for none.
    master: int = 0
    # IFLA_INFO_KIND ("vlan", "macvlan", ...); "" for a physical device.
    kind: str = ""
    # The devices a link names in its kind's own attributes rather than in
    # IFLA_LINK (see _BOUND_IN_INFO_DATA).
    bound: tuple[int, ...] = ()

    def flag(self, name: str) -> bool:
        return bool(self.flags & FLAGS[name])


_IFINFO = struct.Struct("=BxHiII")  # struct ifinfomsg: family, type, index, flags, change
_IFLA = rtnl.numbers(ifinfmsg)
_IFLA_ALT_IFNAME = rtnl.numbers(ifinfmsg.proplist)["IFLA_ALT_IFNAME"]
_IFLA_XDP = rtnl.numbers(ifinfmsg.xdp)
_IFLA_INFO = rtnl.numbers(ifinfmsg.ifinfo)
# The kinds whose IFLA_INFO_DATA names the devices they run on, and which
# attributes (include/uapi/linux/if_link.h): an HSR/PRP device's ports
# (IFLA_HSR_SLAVE1, _SLAVE2, _INTERLINK), a VXLAN's output device
# (IFLA_VXLAN_LINK).  Neither reports it as IFLA_LINK.
_BOUND_IN_INFO_DATA = {"hsr": (1, 2, 8), "vxlan": (3,)}


def _u32(payload: memoryview | None) -> int | None:
    return struct.unpack_from("=I", payload)[0] if payload is not None and len(payload) >= 4 else None


def _xdp(payload: memoryview | None) -> tuple[tuple[int, int], ...]:
    """(detach flag, program id) per attached mode, from IFLA_XDP."""
    if payload is None:
        return ()
    nested = rtnl.attributes(payload, 0)

    def u32(name: str) -> int:
        found = nested.get(_IFLA_XDP[name])
        return _u32(found[0] if found else None) or 0

    attached = nested.get(_IFLA_XDP["IFLA_XDP_ATTACHED"])
    mode = attached[0][0] if attached and len(attached[0]) else 0
    if mode == _XDP_ATTACHED_MULTI:
        found = (
            (XDP_FLAGS_DRV_MODE, u32("IFLA_XDP_DRV_PROG_ID")),
            (XDP_FLAGS_SKB_MODE, u32("IFLA_XDP_SKB_PROG_ID")),
            (XDP_FLAGS_HW_MODE, u32("IFLA_XDP_HW_PROG_ID")),
        )
        return tuple((flag, prog) for flag, prog in found if prog)
    by_mode = {
        _XDP_ATTACHED_DRV: XDP_FLAGS_DRV_MODE,
        _XDP_ATTACHED_SKB: XDP_FLAGS_SKB_MODE,
        _XDP_ATTACHED_HW: XDP_FLAGS_HW_MODE,
    }
    return ((by_mode[mode], u32("IFLA_XDP_PROG_ID")),) if mode in by_mode else ()


def _text(payload: memoryview) -> str:
    return bytes(payload).split(b"\0", 1)[0].decode(errors="replace")


def _kind_and_bound(payload: memoryview | None) -> tuple[str, tuple[int, ...]]:
    """IFLA_LINKINFO's kind, and the devices its data names (_BOUND_IN_INFO_DATA)."""
    if payload is None:
        return "", ()
    info = rtnl.attributes(payload, 0)
    kind_attr = info.get(_IFLA_INFO["IFLA_INFO_KIND"])
    kind = _text(kind_attr[0]) if kind_attr else ""
    data = info.get(_IFLA_INFO["IFLA_INFO_DATA"])
    if kind not in _BOUND_IN_INFO_DATA or not data:
        return kind, ()
    nested = rtnl.attributes(data[0], 0)
    bound = (_u32(nested[n][0]) for n in _BOUND_IN_INFO_DATA[kind] if n in nested)
    return kind, tuple(b for b in bound if b)


def _link_info(answer: bytes) -> LinkInfo:
    _, _, index, flags, _ = _IFINFO.unpack_from(answer, rtnl.HEADER_SIZE)
    attrs = rtnl.attributes(answer)

    def first(name: str) -> memoryview | None:
        found = attrs.get(_IFLA[name])
        return found[0] if found else None

    def text(name: str) -> str:
        payload = first(name)
        return "" if payload is None else _text(payload)

    mac, mtu, carrier, proplist = (
        first("IFLA_ADDRESS"),
        first("IFLA_MTU"),
        first("IFLA_CARRIER"),
        first("IFLA_PROP_LIST"),
    )
    settings = tuple((name, value) for name, attr in SETTINGS.items() if (value := _u32(first(attr))) is not None)
    # A lower device in another namespace is reported with that namespace's
    # id beside its index, which means nothing here.
    lower = 0 if first("IFLA_LINK_NETNSID") is not None else _u32(first("IFLA_LINK")) or 0
    kind, bound = _kind_and_bound(first("IFLA_LINKINFO"))
    altnames: tuple[str, ...] = ()
    if proplist is not None:
        nested = rtnl.attributes(proplist, 0)
        altnames = tuple(_text(a) for a in nested.get(_IFLA_ALT_IFNAME, []))
    return LinkInfo(
        index=index,
        name=text("IFLA_IFNAME"),
        mac=":".join(f"{b:02x}" for b in mac) if mac is not None else "",
        mtu=struct.unpack_from("=I", mtu)[0] if mtu is not None and len(mtu) >= 4 else 0,
        up=bool(flags & IFF_UP),
        carrier=bool(carrier is not None and len(carrier) and carrier[0]),
        promisc=bool(flags & IFF_PROMISC),
        altnames=altnames,
        alias=text("IFLA_IFALIAS"),
        parent_dev=text("IFLA_PARENT_DEV_NAME"),
        flags=flags,
        promiscuity=_u32(first("IFLA_PROMISCUITY")) or 0,
        allmulti_count=_u32(first("IFLA_ALLMULTI")) or 0,
        settings=settings,
        xdp=_xdp(first("IFLA_XDP")),
        lower=lower,
        master=_u32(first("IFLA_MASTER")) or 0,
        kind=kind,
        bound=bound,
    )


def riders(links: list[LinkInfo], base: LinkInfo) -> list[LinkInfo]:
    """The links of ``links`` (one namespace's) that ride ``base``, directly or through each other; the farthest first.

    A link rides another when it is stacked on it or bound to it: the
    kernel's upper devices (``netdev_upper_dev_link``: vlan, macvlan,
    macvtap, ipvlan, ipvtap, macsec, virt_wifi, rmnet, hsr/prp) and the
    tunnels bound to an output device (vxlan, gre, ipip, sit, ip6tnl, vti,
    xfrm with ``dev``).  All but HSR/PRP and VXLAN report that device as
    their IFLA_LINK; those two name it in their own attributes.  Masters
    (bridge, bond, team, vrf, openvswitch) are not riders: ``base`` is
    their port, its IFLA_MASTER.  Two veth peers name each other as
    IFLA_LINK, and neither rides the other.
    """
    found: list[LinkInfo] = []
    seen = {base.index}
    frontier = [base]
    while frontier:
        below = frontier.pop(0)
        for link in links:
            if link.index in seen:
                continue
            peers = link.index == below.lower and link.lower == below.index
            if (link.lower == below.index and not peers) or below.index in link.bound:
                seen.add(link.index)
                found.append(link)
                frontier.append(link)
    return found[::-1]


class Namespace:
    """Link, address and route operations inside one network namespace."""

    def __init__(self, rtnl: Rtnl, path: str | None) -> None:
        self._rtnl = rtnl
        self.path = path

    def close(self) -> None:
        self._rtnl.close()

    def _get(self, fields: dict[str, int], attrs: list[tuple[str, Any]]) -> LinkInfo:
        msg = message(ifinfmsg, fields, attrs)
        return _link_info(self._rtnl.request(RTM_GETLINK, msg)[0])

    def find(self, name: str) -> LinkInfo | None:
        try:
            with translate(f"looking up {name}"):
                return self._get({}, [("IFLA_IFNAME", name)])
        except LinkNotFound:
            return None

    def get(self, index: int) -> LinkInfo:
        with translate(f"reading link {index}"):
            return self._get({"index": index}, [])

    def links(self) -> list[LinkInfo]:
        with translate("listing links"):
            msgs = self._rtnl.request(RTM_GETLINK, message(ifinfmsg, {}, []), NLM_F_DUMP)
            return [_link_info(m) for m in msgs]

    def _set(self, index: int, what: str, attrs: list[tuple[str, Any]], flags: int = 0, change: int = 0) -> None:
        # RTM_NEWLINK on an existing index changes that link (as `ip link set` does);
        # ``change`` says which bits of ``flags`` to apply.
        msg = message(ifinfmsg, {"index": index, "flags": flags, "change": change}, attrs)
        with translate(f"{what} (link {index})"):
            self._rtnl.request(RTM_NEWLINK, msg)

    def set_up(self, index: int, up: bool) -> None:
        self._set(index, "setting link up" if up else "setting link down", [], IFF_UP if up else 0, IFF_UP)

    def rename(self, index: int, name: str) -> None:
        self._set(index, f"renaming to {name}", [("IFLA_IFNAME", name)])

    def set_mtu(self, index: int, mtu: int) -> None:
        self._set(index, f"setting MTU {mtu}", [("IFLA_MTU", mtu)])

    def set_mac(self, index: int, mac: str) -> None:
        self._set(index, f"setting MAC {mac}", [("IFLA_ADDRESS", mac)])

    def set_promisc(self, index: int, on: bool) -> None:
        self._set(index, "setting promiscuous mode", [], IFF_PROMISC if on else 0, IFF_PROMISC)

    def set_link(self, index: int, flags: dict[str, bool], settings: dict[str, int]) -> None:
        """Set ``flags`` (by FLAGS's names) and ``settings`` (by SETTINGS's) in one request."""
        on = sum(FLAGS[name] for name, value in flags.items() if value)
        change = sum(FLAGS[name] for name in flags)
        attrs: list[tuple[str, Any]] = [(SETTINGS[name], value) for name, value in settings.items()]
        what = ", ".join([*flags, *settings])
        self._set(index, f"setting {what}", attrs, on, change)

    def detach_xdp(self, index: int, modes: tuple[int, ...]) -> None:
        """Detach the XDP program of each mode in ``modes`` (XDP_FLAGS_*_MODE)."""
        for mode in modes:
            xdp = {"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", mode)]}
            self._set(index, "detaching XDP", [("IFLA_XDP", xdp)])

    def set_master(self, index: int, master: int) -> None:
        """Make link ``index`` a port of link ``master``; 0 detaches it from its master."""
        self._set(
            index, f"setting master {master}" if master else "detaching from its master", [("IFLA_MASTER", master)]
        )

    def delete(self, index: int) -> None:
        with translate(f"deleting link {index}"):
            self._rtnl.request(RTM_DELLINK, message(ifinfmsg, {"index": index}, []))

    def set_alias(self, index: int, alias: str) -> None:
        self._set(index, "setting alias", [("IFLA_IFALIAS", alias)])

    def _altnames(self, msg_type: int, flags: int, index: int, names: tuple[str, ...], what: str) -> None:
        proplist = {"attrs": [("IFLA_ALT_IFNAME", name) for name in names]}
        msg = message(ifinfmsg, {"index": index}, [("IFLA_PROP_LIST", proplist)])
        with translate(f"{what} altnames {', '.join(names)} (link {index})"):
            self._rtnl.request(msg_type, msg, flags)

    def del_altnames(self, index: int, names: tuple[str, ...]) -> None:
        if names:
            self._altnames(RTM_DELLINKPROP, 0, index, names, "removing")

    def add_altnames(self, index: int, names: tuple[str, ...]) -> None:
        if names:
            self._altnames(RTM_NEWLINKPROP, NLM_F_CREATE | NLM_F_APPEND, index, names, "adding")

    def move(self, index: int, netns_path: str, name: str | None = None) -> None:
        """Move a link to another namespace, renaming it there when ``name`` is given.

        One request does both: the kernel moves the link and renames it
        inside the target under one lock, so no rename is ever visible in
        the source namespace (where udev and NetworkManager would race it).
        The link arrives down and may get a new index.  If ``name`` is taken
        in the target, the kernel may have moved the link under its old name
        before refusing the rename (LinkExists): look for it there.
        """
        fd = open_netns(netns_path)
        attrs: list[tuple[str, Any]] = [("IFLA_NET_NS_FD", fd)]
        if name:
            attrs.append(("IFLA_IFNAME", name))
        try:
            self._set(index, f"moving to {netns_path}" + (f" as {name}" if name else ""), attrs)
        finally:
            os.close(fd)

    def add_address(self, index: int, address: _Interface) -> None:
        ip = str(address.ip)
        attrs = [("IFA_ADDRESS", ip)]
        if address.version == 4:
            # IPv4 needs the local address too (IFA_ADDRESS is the peer's on point-to-point links).
            attrs.append(("IFA_LOCAL", ip))
        family = socket.AF_INET if address.version == 4 else socket.AF_INET6
        msg = message(ifaddrmsg, {"family": family, "prefixlen": address.network.prefixlen, "index": index}, attrs)
        with translate(f"adding address {address} (link {index})"):
            self._rtnl.request(RTM_NEWADDR, msg, NLM_F_CREATE | NLM_F_EXCL)

    def addresses(self, index: int) -> list[_Interface]:
        with translate(f"listing addresses (link {index})"):
            answers = self._rtnl.request(RTM_GETADDR, message(ifaddrmsg, {}, []), NLM_F_DUMP)
            msgs = [rtnl.decoded(ifaddrmsg, a) for a in answers]
            return [
                ipaddress.ip_interface(f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}")
                for m in msgs
                if m["index"] == index and m.get_attr("IFA_ADDRESS")
            ]

    def add_route(
        self,
        index: int,
        dst: _Network,
        gateway: _Address | None,
        *,
        priority: int | None = None,
        table: int | None = None,
        scope: int | None = None,
        mtu: int | None = None,
        advmss: int | None = None,
    ) -> None:
        fields = {
            "family": socket.AF_INET if dst.version == 4 else socket.AF_INET6,
            "dst_len": dst.prefixlen,
            # The header holds 8 bits of table id; RTA_TABLE (below) carries any.
            "table": table if table and table < 256 else RT_TABLE_MAIN,
            "proto": RTPROT_STATIC,
            "scope": scope or 0,
            "type": RTN_UNICAST,
        }
        attrs: list[tuple[str, Any]] = [("RTA_OIF", index)]
        if dst.prefixlen:
            attrs.append(("RTA_DST", str(dst.network_address)))
        if gateway is not None:
            attrs.append(("RTA_GATEWAY", str(gateway)))
        if priority is not None:
            attrs.append(("RTA_PRIORITY", priority))
        if table:
            attrs.append(("RTA_TABLE", table))
        metrics = [(k, v) for k, v in (("RTAX_MTU", mtu), ("RTAX_ADVMSS", advmss)) if v is not None]
        if metrics:
            attrs.append(("RTA_METRICS", {"attrs": metrics}))
        with translate(f"adding route {dst} via {gateway or 'link'} (link {index})"):
            self._rtnl.request(RTM_NEWROUTE, message(rtmsg, fields, attrs), NLM_F_CREATE | NLM_F_EXCL)

    def routes(self, index: int) -> list[tuple[_Network, _Address | None]]:
        """The routes through link ``index``, in every table."""
        out: list[tuple[_Network, _Address | None]] = []
        with translate(f"listing routes (link {index})"):
            for family in (socket.AF_INET, socket.AF_INET6):
                answers = self._rtnl.request(RTM_GETROUTE, message(rtmsg, {"family": family}, []), NLM_F_DUMP)
                for m in (rtnl.decoded(rtmsg, a) for a in answers):
                    if m.get_attr("RTA_OIF") != index:
                        continue
                    dst = m.get_attr("RTA_DST")
                    net = ipaddress.ip_network(
                        f"{dst}/{m['dst_len']}" if dst else ("::/0" if family == socket.AF_INET6 else "0.0.0.0/0")
                    )
                    gw = m.get_attr("RTA_GATEWAY")
                    out.append((net, ipaddress.ip_address(gw) if gw else None))
        return out

    def set_sysctl(self, key: str, value: str) -> None:
        """Write a per-namespace sysctl under /proc/sys/net from inside this namespace (NamespaceError)."""

        def write() -> None:
            with open(f"/proc/sys/net/{key}", "w") as f:
                f.write(value)

        run_in_netns(self.path, write)
