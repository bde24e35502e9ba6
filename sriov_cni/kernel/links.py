"""Link, address and route operations inside one network namespace, over netlink.

:class:`Namespace` wraps a pyroute2 handle; :mod:`sriov_cni.kernel.handles` opens
and caches them.  pyroute2's ``NetlinkError`` becomes the exceptions of
:mod:`sriov_cni.kernel.nlerrors` here (:func:`translate`).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyroute2 import NetlinkError as _PyNetlinkError

from sriov_cni.cni import IPAddress, IPInterface, IPNetwork
from sriov_cni.kernel.netns import open_netns, run_in_netns
from sriov_cni.kernel.nlerrors import LinkNotFound, for_errno

IFF_UP = 0x1
IFF_PROMISC = 0x100


@contextmanager
def translate(what: str) -> Iterator[None]:
    try:
        yield
    except _PyNetlinkError as exc:
        raise for_errno(what, int(exc.code)) from exc


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
    parent_bus: str
    parent_dev: str


def _link_info(msg: Any) -> LinkInfo:
    flags = int(msg["flags"])
    proplist = msg.get_attr("IFLA_PROP_LIST")
    altnames: tuple[str, ...] = ()
    if proplist is not None:
        altnames = tuple(str(a) for a in proplist.get_attrs("IFLA_ALT_IFNAME"))
    return LinkInfo(
        index=int(msg["index"]),
        name=str(msg.get_attr("IFLA_IFNAME")),
        mac=str(msg.get_attr("IFLA_ADDRESS") or ""),
        mtu=int(msg.get_attr("IFLA_MTU") or 0),
        up=bool(flags & IFF_UP),
        carrier=bool(msg.get_attr("IFLA_CARRIER")),
        promisc=bool(flags & IFF_PROMISC),
        altnames=altnames,
        alias=str(msg.get_attr("IFLA_IFALIAS") or ""),
        parent_bus=str(msg.get_attr("IFLA_PARENT_DEV_BUS_NAME") or ""),
        parent_dev=str(msg.get_attr("IFLA_PARENT_DEV_NAME") or ""),
    )


class Namespace:
    """Link, address and route operations inside one network namespace."""

    def __init__(self, ipr: Any, path: str | None) -> None:
        self._ipr = ipr
        self.path = path

    def close(self) -> None:
        self._ipr.close()

    def find(self, name: str) -> LinkInfo | None:
        try:
            with translate(f"looking up {name}"):
                return _link_info(self._ipr.link("get", ifname=name)[0])
        except LinkNotFound:
            return None

    def get(self, index: int) -> LinkInfo:
        with translate(f"reading link {index}"):
            return _link_info(self._ipr.link("get", index=index)[0])

    def links(self) -> list[LinkInfo]:
        with translate("listing links"):
            return [_link_info(m) for m in self._ipr.link("dump")]

    def _set(self, index: int, what: str, **kwargs: Any) -> None:
        with translate(f"{what} (link {index})"):
            self._ipr.link("set", index=index, **kwargs)

    def set_up(self, index: int, up: bool) -> None:
        self._set(index, "setting link up" if up else "setting link down", state="up" if up else "down")

    def rename(self, index: int, name: str) -> None:
        self._set(index, f"renaming to {name}", ifname=name)

    def set_mtu(self, index: int, mtu: int) -> None:
        self._set(index, f"setting MTU {mtu}", mtu=mtu)

    def set_mac(self, index: int, mac: str) -> None:
        self._set(index, f"setting MAC {mac}", address=mac)

    def set_promisc(self, index: int, on: bool) -> None:
        self._set(index, "setting promiscuous mode", flags=IFF_PROMISC if on else 0, change=IFF_PROMISC)

    def set_alias(self, index: int, alias: str) -> None:
        self._set(index, "setting alias", ifalias=alias)

    def del_altnames(self, index: int, names: tuple[str, ...]) -> None:
        if names:
            with translate(f"removing altnames {', '.join(names)} (link {index})"):
                self._ipr.link("property_del", index=index, altname=list(names))

    def add_altnames(self, index: int, names: tuple[str, ...]) -> None:
        if names:
            with translate(f"adding altnames {', '.join(names)} (link {index})"):
                self._ipr.link("property_add", index=index, altname=list(names))

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
        extra = {"ifname": name} if name else {}
        try:
            self._set(index, f"moving to {netns_path}" + (f" as {name}" if name else ""), net_ns_fd=fd, **extra)
        finally:
            os.close(fd)

    def add_address(self, index: int, address: IPInterface) -> None:
        with translate(f"adding address {address} (link {index})"):
            self._ipr.addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen)

    def addresses(self, index: int) -> list[IPInterface]:
        with translate(f"listing addresses (link {index})"):
            msgs = self._ipr.addr("dump", index=index)
            return [
                ipaddress.ip_interface(f"{m.get_attr('IFA_ADDRESS')}/{m['prefixlen']}")
                for m in msgs
                if m.get_attr("IFA_ADDRESS")
            ]

    def add_route(
        self,
        index: int,
        dst: IPNetwork,
        gateway: IPAddress | None,
        *,
        priority: int | None = None,
        table: int | None = None,
        scope: int | None = None,
        mtu: int | None = None,
        advmss: int | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"oif": index, "dst": str(dst) if dst.prefixlen else "default"}
        if dst.version == 6:
            kwargs["family"] = 10
        if gateway is not None:
            kwargs["gateway"] = str(gateway)
        if priority is not None:
            kwargs["priority"] = priority
        if table is not None:
            kwargs["table"] = table
        if scope is not None:
            kwargs["scope"] = scope
        metrics = {k: v for k, v in (("mtu", mtu), ("advmss", advmss)) if v is not None}
        if metrics:
            kwargs["metrics"] = metrics
        with translate(f"adding route {dst} via {gateway or 'link'} (link {index})"):
            self._ipr.route("add", **kwargs)

    def routes(self, index: int) -> list[tuple[IPNetwork, IPAddress | None]]:
        out: list[tuple[IPNetwork, IPAddress | None]] = []
        with translate(f"listing routes (link {index})"):
            for family in (2, 10):
                for m in self._ipr.route("dump", family=family, oif=index):
                    dst = m.get_attr("RTA_DST")
                    net = ipaddress.ip_network(f"{dst}/{m['dst_len']}" if dst else ("::/0" if family == 10 else "0.0.0.0/0"))
                    gw = m.get_attr("RTA_GATEWAY")
                    out.append((net, ipaddress.ip_address(gw) if gw else None))
        return out

    def set_sysctl(self, key: str, value: str) -> None:
        """Write a per-namespace sysctl under /proc/sys/net from inside this namespace."""

        def write() -> None:
            with open(f"/proc/sys/net/{key}", "w") as f:
                f.write(value)

        run_in_netns(self.path, write)
