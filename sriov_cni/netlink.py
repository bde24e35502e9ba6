"""Every netlink call the project makes, and the only module that imports pyroute2.

pyroute2's ``NetlinkError`` codes become a handful of domain exceptions here,
so callers decide on *what happened* (link gone, name taken, driver cannot do
it) rather than on errno numbers.

Two kinds of operations live here:

* link operations inside one network namespace (:class:`Namespace`, opened
  with :func:`namespace`), used on VF netdevs;
* PF-side VF settings (:class:`KernelVfControl`), which go through the PF's
  netdev in the host namespace.  Callers depend on the :class:`VfControl`
  protocol so tests without SR-IOV hardware can substitute a fake for exactly
  this part and nothing else.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import ipaddress
import os
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pyroute2 import IPRoute, NetlinkError as _PyNetlinkError
from pyroute2 import netns as _netns
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg as _ifinfmsg

from sriov_cni.cni import IPAddress, IPInterface, IPNetwork

# pyroute2 encodes IFLA_VF_VLAN_INFO as 14 bytes, but the kernel's
# struct ifla_vf_vlan_info is 16 (two bytes of tail padding), and kernels
# that validate the nested VLAN list (commit 1aec77b2bb2e, backported to
# stable) reject the short form with EINVAL.  The list form is the only way
# to set an 802.1ad VLAN, so give the struct its real size.  Decoding the
# kernel's 16-byte answers is unaffected.
_IVVI = _ifinfmsg.vflist.vfinfo.vf_vlist.ivvi
if len(_IVVI.fields) == 4:
    _IVVI.fields = _IVVI.fields + (("__pad", "H"),)

IFF_UP = 0x1
IFF_PROMISC = 0x100

VLAN_PROTO_8021Q = 0x8100
VLAN_PROTO_8021AD = 0x88A8

LINK_STATE_AUTO = 0
LINK_STATE_ENABLE = 1
LINK_STATE_DISABLE = 2


class NetlinkError(Exception):
    """A netlink request failed; ``errno`` is the kernel's answer."""

    def __init__(self, msg: str, code: int = 0) -> None:
        super().__init__(msg)
        self.errno = code


class LinkNotFound(NetlinkError):
    pass


class LinkExists(NetlinkError):
    pass


class NotSupported(NetlinkError):
    pass


class InvalidArgument(NetlinkError):
    pass


class Busy(NetlinkError):
    pass


class NetnsNotFound(NetlinkError):
    pass


class AddressRefused(NetlinkError):
    """The device refused a MAC address (igbvf: the PF holds an admin MAC for the VF)."""


_BY_ERRNO: dict[int, type[NetlinkError]] = {
    errno.ENODEV: LinkNotFound,
    errno.ENOENT: LinkNotFound,
    errno.EEXIST: LinkExists,
    errno.ENOTEMPTY: LinkExists,
    errno.EOPNOTSUPP: NotSupported,
    errno.EINVAL: InvalidArgument,
    errno.ERANGE: InvalidArgument,
    errno.EBUSY: Busy,
    errno.EAGAIN: Busy,
    errno.EADDRNOTAVAIL: AddressRefused,
}


@contextmanager
def _translate(what: str) -> Iterator[None]:
    try:
        yield
    except _PyNetlinkError as exc:
        code = int(exc.code)
        raise _BY_ERRNO.get(code, NetlinkError)(f"{what}: {os.strerror(code)}", code) from exc


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


@dataclass(frozen=True)
class VfInfo:
    """A VF's PF-side settings as the PF reports them (``None``: not reported)."""

    index: int
    mac: str
    vlan: int
    qos: int
    vlan_proto: int
    spoofchk: bool | None
    trust: bool | None
    link_state: int | None
    min_tx_rate: int
    max_tx_rate: int


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


def _fd_of(netns_path: str) -> int:
    try:
        # O_NONBLOCK: a FIFO in place of a namespace must not hang the call.
        return os.open(netns_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NetnsNotFound(f"network namespace {netns_path} does not exist", errno.ENOENT) from exc
    except OSError as exc:
        raise NetnsNotFound(f"cannot open network namespace {netns_path}: {exc.strerror}", exc.errno or 0) from exc


def own_netns_path() -> str:
    """The namespace this process runs in (the "host" side of every move)."""
    return f"/proc/{os.getpid()}/ns/net"


class Namespace:
    """Link, address and route operations inside one network namespace."""

    def __init__(self, ipr: Any, path: str | None) -> None:
        self._ipr = ipr
        self.path = path

    def close(self) -> None:
        self._ipr.close()

    def find(self, name: str) -> LinkInfo | None:
        try:
            with _translate(f"looking up {name}"):
                return _link_info(self._ipr.link("get", ifname=name)[0])
        except LinkNotFound:
            return None

    def get(self, index: int) -> LinkInfo:
        with _translate(f"reading link {index}"):
            return _link_info(self._ipr.link("get", index=index)[0])

    def links(self) -> list[LinkInfo]:
        with _translate("listing links"):
            return [_link_info(m) for m in self._ipr.link("dump")]

    def _set(self, index: int, what: str, **kwargs: Any) -> None:
        with _translate(f"{what} (link {index})"):
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
            with _translate(f"removing altnames {', '.join(names)} (link {index})"):
                self._ipr.link("property_del", index=index, altname=list(names))

    def add_altnames(self, index: int, names: tuple[str, ...]) -> None:
        if names:
            with _translate(f"adding altnames {', '.join(names)} (link {index})"):
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
        fd = _fd_of(netns_path)
        extra = {"ifname": name} if name else {}
        try:
            self._set(index, f"moving to {netns_path}" + (f" as {name}" if name else ""), net_ns_fd=fd, **extra)
        finally:
            os.close(fd)

    def add_address(self, index: int, address: IPInterface) -> None:
        with _translate(f"adding address {address} (link {index})"):
            self._ipr.addr("add", index=index, address=str(address.ip), prefixlen=address.network.prefixlen)

    def addresses(self, index: int) -> list[IPInterface]:
        with _translate(f"listing addresses (link {index})"):
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
        with _translate(f"adding route {dst} via {gateway or 'link'} (link {index})"):
            self._ipr.route("add", **kwargs)

    def routes(self, index: int) -> list[tuple[IPNetwork, IPAddress | None]]:
        out: list[tuple[IPNetwork, IPAddress | None]] = []
        with _translate(f"listing routes (link {index})"):
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


_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_SLAVE = 0x80000


def _private_sysfs() -> None:
    # sysfs shows the netdevs of the namespace that mounted it, so a fresh
    # mount in a private mount namespace shows the pod's interfaces
    # (what `ip netns exec` does).
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / a slave mount")
    libc.umount2(b"/sys", 2)  # MNT_DETACH; nothing mounted there is fine
    if libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mounting sysfs")


def run_in_netns(path: str | None, func: Callable[[], None], *, own_sysfs: bool = False) -> None:
    """Run ``func`` with the calling context inside the network namespace ``path``.

    /proc/sys/net and (with ``own_sysfs``) /sys/class/net reflect the
    namespace of the process that looks, so ``func`` runs in a short-lived
    forked child that enters the namespace; this process never leaves its
    own.  ``path`` None runs ``func`` here.  An OSError in ``func`` is
    reported as NetlinkError carrying its errno.
    """
    if path is None:
        func()
        return
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        code = 0
        message = b""
        try:
            _netns.setns(path, flags=0)
            if own_sysfs:
                _private_sysfs()
            func()
        except OSError as exc:
            code = exc.errno or errno.EIO
            message = str(exc).encode()
        except BaseException as exc:  # the child must always reach _exit
            code = errno.EIO
            message = repr(exc).encode()
        os.write(write_end, message[:4000])
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        reason = r.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise NetlinkError(f"in network namespace {path}: {reason or os.strerror(code)}", code)


_CLONE_NEWNET = 0x40000000
_NETLINK_ROUTE = 0


def _setns(fd: int) -> None:
    if _libc().setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _socket_in(path: str) -> socket.socket:
    """A netlink socket created inside the namespace at ``path``.

    A socket stays in the namespace it was created in, so this thread steps
    in, creates it and steps straight back: a few system calls, where
    pyroute2's own way forks a helper process for every handle.
    """
    target = _fd_of(path)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            _setns(target)
        except OSError as exc:
            raise NetnsNotFound(f"cannot enter network namespace {path}: {exc.strerror}", exc.errno or 0) from exc
        try:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_ROUTE)
        finally:
            # Staying in the pod's namespace would misdirect every later
            # host-side operation of this process; there is no safe way on.
            try:
                _setns(home)
            except OSError:
                os._exit(70)
    finally:
        os.close(target)
        os.close(home)


def _open(path: str | None) -> Namespace:
    ipr = IPRoute(use_socket=_socket_in(path)) if path else IPRoute()
    return Namespace(ipr, path)


# Handles kept open for the duration of a session (one CNI command):
# opening a handle inside another namespace costs more than most requests.
_session: dict[str | None, Namespace] | None = None
# Handles taken out of the session after a failure, closed at its end.
_retired: list[Namespace] = []


@contextmanager
def session() -> Iterator[None]:
    """Reuse one handle per namespace until the block ends."""
    global _session
    if _session is not None:
        yield
        return
    _session = {}
    try:
        yield
    finally:
        handles, _session = _session, None
        for ns in [*handles.values(), *_retired]:
            ns.close()
        _retired.clear()


@contextmanager
def namespace(path: str | None = None) -> Iterator[Namespace]:
    """A netlink handle bound to the namespace at ``path`` (``None``: our own).

    Never creates a namespace: pyroute2's default would make a new empty one
    for a path that vanished, hiding exactly the case DEL must recognise.
    """
    if _session is None:
        ns = _open(path)
        try:
            yield ns
        finally:
            ns.close()
        return
    ns = _session.get(path) or _open(path)
    _session[path] = ns
    try:
        yield ns
    except NetlinkError:
        # A failed request may leave the handle unusable (the namespace
        # may be gone); the next use opens a fresh one.  Only this handle
        # leaves the cache (a nested use may already have replaced it, and
        # dropping that one leaked its socket), and it is closed when the
        # session ends, since an enclosing block may still hold it.
        if _session is not None and _session.get(path) is ns:
            del _session[path]
        _retired.append(ns)
        raise


def netns_inode(path: str) -> int | None:
    """Identity of a network namespace file, or None when it is gone (or is no namespace file)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    # A namespace file (nsfs) stats as a regular file; a FIFO or a device
    # there is not one, and opening it could block.
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_ino


def is_own_netns(path: str) -> bool:
    """Whether ``path`` is the network namespace this process runs in (the host's)."""
    try:
        there, here = os.stat(path), os.stat(own_netns_path())
    except (OSError, ValueError):
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


# --- PF-side VF settings ---------------------------------------------------


class VfControl(Protocol):
    """PF-side VF operations, addressed by PF netdev name and VF index."""

    def vfs(self, pf: str) -> dict[int, VfInfo]: ...

    def set_mac(self, pf: str, vf: int, mac: str) -> None: ...

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None: ...

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None: ...

    def set_trust(self, pf: str, vf: int, on: bool) -> None: ...

    def set_link_state(self, pf: str, vf: int, state: int) -> None: ...

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None: ...


def _setting(attrs: Any, name: str, key: str) -> int | None:
    nla = attrs.get_attr(name)
    if nla is None:
        return None
    value = int(nla[key])
    # Drivers that do not implement a setting report it as (u32)-1.
    return None if value == 0xFFFFFFFF else value


def _vf_info(vfinfo: Any) -> VfInfo:
    mac = vfinfo.get_attr("IFLA_VF_MAC")
    vlan = vfinfo.get_attr("IFLA_VF_VLAN")
    rate = vfinfo.get_attr("IFLA_VF_RATE")
    proto = VLAN_PROTO_8021Q
    vlist = vfinfo.get_attr("IFLA_VF_VLAN_LIST")
    if vlist is not None:
        infos = vlist.get_attrs("IFLA_VF_VLAN_INFO")
        if infos and int(infos[0]["proto"]):
            proto = int(infos[0]["proto"])
    spoofchk = _setting(vfinfo, "IFLA_VF_SPOOFCHK", "spoofchk")
    trust = _setting(vfinfo, "IFLA_VF_TRUST", "trust")
    return VfInfo(
        index=int(mac["vf"]),
        mac=str(mac["mac"]),
        vlan=int(vlan["vlan"]) if vlan is not None else 0,
        qos=int(vlan["qos"]) if vlan is not None else 0,
        vlan_proto=proto,
        spoofchk=None if spoofchk is None else bool(spoofchk),
        trust=None if trust is None else bool(trust),
        link_state=_setting(vfinfo, "IFLA_VF_LINK_STATE", "link_state"),
        min_tx_rate=int(rate["min_tx_rate"]) if rate is not None else 0,
        max_tx_rate=int(rate["max_tx_rate"]) if rate is not None else 0,
    )


class KernelVfControl:
    """:class:`VfControl` through the kernel, in this process's namespace."""

    def __init__(self) -> None:
        self._ipr: Any = None
        self._indexes: dict[str, int] = {}

    def _handle(self) -> Any:
        # One handle for the process, opened on first use: a CNI call
        # makes several VF requests in a row.
        if self._ipr is None:
            self._ipr = IPRoute()
        return self._ipr

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def _index(self, pf: str) -> int:
        if pf not in self._indexes:
            with _translate(f"looking up PF {pf}"):
                found = self._handle().link_lookup(ifname=pf)
            if not found:
                raise LinkNotFound(f"PF {pf} not found", errno.ENODEV)
            self._indexes[pf] = int(found[0])
        return self._indexes[pf]

    def vfs(self, pf: str) -> dict[int, VfInfo]:
        index = self._index(pf)
        with _translate(f"reading VFs of {pf}"):
            # ext_mask=1 (RTEXT_FILTER_VF): without it the kernel leaves VF info out.
            msg = self._handle().link("get", index=index, ext_mask=1)[0]
        vflist = msg.get_attr("IFLA_VFINFO_LIST")
        if vflist is None:
            return {}
        infos = (_vf_info(v) for v in vflist.get_attrs("IFLA_VF_INFO"))
        return {info.index: info for info in infos}

    def _set_vf(self, pf: str, what: str, spec: dict[str, Any]) -> None:
        index = self._index(pf)
        # pyroute2 consumes the dict it is given; every call builds a fresh one.
        with _translate(f"{what} on {pf} VF {spec['vf']}"):
            self._handle().link("set", index=index, vf=spec)

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._set_vf(pf, f"setting admin MAC {mac}", {"vf": vf, "mac": mac})

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        if proto == VLAN_PROTO_8021Q:
            # The plain IFLA_VF_VLAN form works on every driver that has VLANs.
            spec: dict[str, Any] = {"vf": vf, "vlan": {"vlan": vlan, "qos": qos}}
        else:
            spec = {"vf": vf, "vlan": [{"vlan": vlan, "qos": qos, "proto": proto}]}
        self._set_vf(pf, f"setting VLAN {vlan} qos {qos} proto {proto:#06x}", spec)

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, f"setting spoofchk {'on' if on else 'off'}", {"vf": vf, "spoofchk": int(on)})

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, f"setting trust {'on' if on else 'off'}", {"vf": vf, "trust": int(on)})

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._set_vf(pf, f"setting link_state {state}", {"vf": vf, "link_state": state})

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None:
        # IFLA_VF_RATE carries both limits: always send both, or one resets the other.
        spec = {"vf": vf, "rate": {"min_tx_rate": min_tx_rate, "max_tx_rate": max_tx_rate}}
        self._set_vf(pf, f"setting tx rate {min_tx_rate}-{max_tx_rate} Mbps", spec)
