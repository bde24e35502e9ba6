"""The ``ipam`` section of a network configuration, parsed and validated.

The schema is host-local's, so a network can switch between host-local and
``sriov-ipam`` without editing its configuration.  Every rejection is a
``CNIError(Code.INVALID_CONFIG)`` whose message starts with the JSON path of
the offending field, so an operator can find it without reading code.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sriov_cni import safepath
from sriov_cni.cni import DNS, CmdArgs, CNIError, Code, IPAddress, IPNetwork, Route, shown

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
# A resolv.conf is a few hundred bytes; the bound keeps /dev/zero-like
# files from being read without end.
MAX_RESOLV_CONF = 64 * 1024


def _bad(field: str, msg: str) -> CNIError:
    return CNIError(Code.INVALID_CONFIG, f"{field} {msg}")


@dataclass(frozen=True)
class Range:
    """One ``{subnet, rangeStart, rangeEnd, gateway}`` entry, defaults filled in."""

    field: str
    subnet: IPNetwork
    start: IPAddress
    end: IPAddress
    gateway: IPAddress

    @property
    def skipped(self) -> frozenset[IPAddress]:
        """Addresses inside the window that are never handed out."""
        out = {self.gateway, self.subnet.network_address}
        # IPv6 has no broadcast; its last address is an ordinary host address.
        if self.subnet.version == 4:
            out.add(self.subnet.broadcast_address)
        return frozenset(out)

    def contains(self, ip: IPAddress) -> bool:
        return ip.version == self.start.version and int(self.start) <= int(ip) <= int(self.end)

    def capacity(self) -> int:
        """How many addresses this range can hand out."""
        window = int(self.end) - int(self.start) + 1
        return window - sum(1 for ip in self.skipped if self.contains(ip))

    def __str__(self) -> str:
        return f"{self.field} {self.subnet} ({self.start}-{self.end})"


def _start(r: Range) -> tuple[int, int]:
    return r.start.version, int(r.start)


T = TypeVar("T")


class _ByStart(Generic[T]):
    """Ranges that do not overlap, each with a value, found by an address in log n.

    A network may list thousands of ranges; an ADD, CHECK or STATUS that
    asked each range in turn about each address was quadratic.  Sorted by
    start, the only range that can hold an address is the last one starting
    at or below it.
    """

    def __init__(self, entries: Iterable[tuple[Range, T]]) -> None:
        self._entries = sorted(entries, key=lambda e: _start(e[0]))
        self._starts = [_start(r) for r, _ in self._entries]

    def find(self, ip: IPAddress) -> tuple[Range, T] | None:
        at = bisect.bisect_right(self._starts, (ip.version, int(ip))) - 1
        if at < 0:
            return None
        r, value = self._entries[at]
        return (r, value) if r.contains(ip) else None


@dataclass(frozen=True)
class RangeSet:
    """Ranges of one address family; an attachment gets one address per set."""

    index: int
    field: str
    ranges: tuple[Range, ...]

    @functools.cached_property
    def _positions(self) -> _ByStart[int]:
        return _ByStart((r, i) for i, r in enumerate(self.ranges))

    def position(self, ip: IPAddress) -> int | None:
        """Where in ``ranges`` the range holding ``ip`` is; None when none holds it."""
        found = self._positions.find(ip)
        return None if found is None else found[1]

    def capacity(self) -> int:
        return sum(r.capacity() for r in self.ranges)


@dataclass(frozen=True)
class Requested:
    """A specific address the runtime asked for, and where it was asked."""

    address: IPAddress
    field: str
    range: Range


@dataclass(frozen=True)
class IPAMConfig:
    network: str
    data_dir: str
    range_sets: tuple[RangeSet, ...]
    routes: tuple[Route, ...]
    dns: DNS

    @functools.cached_property
    def _sets(self) -> _ByStart[RangeSet]:
        return _ByStart((r, s) for s in self.range_sets for r in s.ranges)

    def locate(self, ip: IPAddress) -> tuple[RangeSet, Range] | None:
        """The range set and range that hold ``ip``, if any: ranges never overlap (load checks)."""
        found = self._sets.find(ip)
        return None if found is None else (found[1], found[0])


def _section(conf: Mapping[str, Any]) -> Mapping[str, Any]:
    ipam = conf.get("ipam")
    if not isinstance(ipam, dict):
        raise _bad("ipam", "must be an object")
    return ipam


def store_location(conf: Mapping[str, Any]) -> tuple[str, str]:
    """``(dataDir, network name)``: all that DEL and GC need.

    They deliberately skip range validation: a DEL must still release after an
    operator broke or changed the ranges, or the pod can never terminate.
    """
    data_dir = _section(conf).get("dataDir", DEFAULT_DATA_DIR)
    if not isinstance(data_dir, str) or not data_dir:
        raise _bad("ipam.dataDir", "must be a non-empty string")
    data_dir = safepath.absolute(data_dir, "ipam.dataDir")
    # dispatch has already checked the name against libcni's rule, which
    # keeps it a single path component.
    return data_dir, str(conf["name"])


def _ip(raw: Any, field: str) -> IPAddress:
    if not isinstance(raw, str):
        raise _bad(field, f"{shown(raw)} must be a string")
    try:
        return ipaddress.ip_address(raw)
    except ValueError:
        raise _bad(field, f"{shown(raw)} is not an IP address") from None


def _subnet(raw: Any, field: str) -> IPNetwork:
    if not isinstance(raw, str):
        raise _bad(field, f"{shown(raw)} must be a CIDR string")
    try:
        net = ipaddress.ip_network(raw)
    except ValueError:
        try:
            loose = ipaddress.ip_network(raw, strict=False)
        except ValueError:
            raise _bad(field, f"{shown(raw)} is not a CIDR subnet") from None
        raise _bad(field, f"{raw} has host bits set (the subnet is {loose})") from None
    if net.max_prefixlen - net.prefixlen < 2:
        raise _bad(field, f"{raw} is too small to allocate from (needs at least 2 host bits)")
    return net


def _parse_range(raw: Any, field: str) -> Range:
    if not isinstance(raw, dict):
        raise _bad(field, "must be an object with at least a subnet")
    if "subnet" not in raw:
        raise _bad(f"{field}.subnet", "is missing")
    subnet = _subnet(raw["subnet"], f"{field}.subnet")

    def address(key: str, default: IPAddress) -> IPAddress:
        if raw.get(key) in (None, ""):
            return default
        ip = _ip(raw[key], f"{field}.{key}")
        if ip not in subnet:
            raise _bad(f"{field}.{key}", f"{ip} is outside subnet {subnet}")
        return ip

    first_host = subnet.network_address + 1
    # host-local's defaults: .1 is both gateway and range start (the
    # allocator skips the gateway); IPv4 stops before the broadcast address.
    last = subnet.broadcast_address - 1 if subnet.version == 4 else subnet.broadcast_address
    start = address("rangeStart", first_host)
    end = address("rangeEnd", last)
    if int(start) > int(end):
        raise _bad(f"{field}.rangeStart", f"{start} is after rangeEnd {end}")
    return Range(field, subnet, start, end, address("gateway", first_host))


def _parse_set(raw: Any, index: int, field: str) -> RangeSet:
    if not isinstance(raw, list) or not raw:
        raise _bad(field, "must be a non-empty list of ranges")
    ranges = tuple(_parse_range(r, f"{field}[{i}]") for i, r in enumerate(raw))
    family = ranges[0].subnet.version
    for r in ranges[1:]:
        if r.subnet.version != family:
            raise _bad(
                f"{r.field}.subnet",
                f"{r.subnet} is IPv{r.subnet.version} but {field} is IPv{family} (one family per range set)",
            )
    return RangeSet(index, field, ranges)


def _check_ranges(sets: list[RangeSet]) -> None:
    # Sorted by family and start, two ranges overlap only if neighbours do,
    # so this is n log n: thousands of ranges were a pairwise check of
    # seconds.
    declared = [r for s in sets for r in s.ranges]
    order = {id(r): i for i, r in enumerate(declared)}
    ranges = sorted(declared, key=lambda r: (r.start.version, int(r.start), int(r.end)))
    for low, high in itertools.pairwise(ranges):
        if low.contains(high.start):
            # Name the one configured later, as the operator reads the file.
            earlier, later = sorted((low, high), key=lambda r: order[id(r)])
            raise _bad(later.field, f"{later.subnet} ({later.start}-{later.end}) overlaps {earlier}")
    # A range skips only its own gateway, so another range's gateway inside
    # its window would be handed to a pod.  Ranges no longer overlap, so at
    # most one range holds a gateway.
    by_start = _ByStart((r, None) for r in ranges)
    for r in ranges:
        found = by_start.find(r.gateway)
        other = None if found is None else found[0]
        if other is not None and other is not r and other.gateway != r.gateway:
            raise _bad(f"{r.field}.gateway", f"{r.gateway} is inside {other}, which would hand it out")


def _parse_routes(raw: Any) -> tuple[Route, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("ipam.routes", "must be a list of {dst, gw} objects")
    routes = []
    for i, r in enumerate(raw):
        field = f"ipam.routes[{i}]"
        if not isinstance(r, dict):
            raise _bad(field, "must be an object with dst and optional gw")
        dst = r.get("dst")
        if not isinstance(dst, str):
            raise _bad(f"{field}.dst", f"{shown(dst)} must be a CIDR string")
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            raise _bad(f"{field}.dst", f"{shown(dst)} is not a CIDR") from None
        gw = _ip(r["gw"], f"{field}.gw") if r.get("gw") not in (None, "") else None
        if gw is not None and gw.version != net.version:
            raise _bad(f"{field}.gw", f"{gw} is not the same address family as dst {net}")
        routes.append(Route(dst=net, gw=gw))
    return tuple(routes)


def _parse_resolv_conf(raw: Any) -> DNS:
    if raw in (None, ""):
        return DNS()
    field = "ipam.resolvConf"
    if not isinstance(raw, str):
        raise _bad(field, f"{shown(raw)} must be a path")
    if "\0" in raw:
        raise _bad(field, f"{shown(raw)} is not a usable path")
    try:
        text = safepath.read_file(raw, MAX_RESOLV_CONF).decode("utf-8", errors="replace")
    except OSError as exc:
        raise _bad(field, f"{raw} cannot be read: {exc.strerror}") from None
    dns = DNS()
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) < 2:
            continue
        key, values = words[0], words[1:]
        if key == "nameserver":
            dns.nameservers.append(values[0])
        elif key == "domain":
            dns.domain = values[0]
        elif key == "search":
            dns.search = values
        elif key == "options":
            dns.options.extend(values)
    return dns


def load(conf: Mapping[str, Any]) -> IPAMConfig:
    """Parse and validate the whole ``ipam`` section (ADD, CHECK, STATUS)."""
    data_dir, network = store_location(conf)
    ipam = _section(conf)
    sets: list[RangeSet] = []
    # host-local puts the legacy single range first, so it is range set 0
    # and owns last_reserved_ip.0.  Its keys sit directly under "ipam".
    if ipam.get("subnet") is not None:
        sets.append(RangeSet(0, "ipam", (_parse_range(ipam, "ipam"),)))
    ranges = ipam.get("ranges")
    if ranges is not None:
        if not isinstance(ranges, list):
            raise _bad("ipam.ranges", "must be a list of range sets")
        offset = len(sets)
        sets.extend(_parse_set(raw, offset + i, f"ipam.ranges[{i}]") for i, raw in enumerate(ranges))
    if not sets:
        raise _bad("ipam.ranges", "is missing: configure ipam.ranges or ipam.subnet")
    _check_ranges(sets)
    return IPAMConfig(
        network=network,
        data_dir=data_dir,
        range_sets=tuple(sets),
        routes=_parse_routes(ipam.get("routes")),
        dns=_parse_resolv_conf(ipam.get("resolvConf")),
    )


def _requested_strings(cmd: CmdArgs) -> list[tuple[Any, str]]:
    """``(value, field)`` pairs of the addresses the runtime asked for."""
    out: list[tuple[Any, str]] = []
    args = cmd.conf.get("args")
    cni_args = args.get("cni") if isinstance(args, dict) else None
    structured = [
        (cni_args.get("ips") if isinstance(cni_args, dict) else None, "args.cni.ips"),
        (
            cmd.conf["runtimeConfig"].get("ips") if isinstance(cmd.conf.get("runtimeConfig"), dict) else None,
            "runtimeConfig.ips",
        ),
    ]
    for values, field in structured:
        if values is None:
            continue
        if not isinstance(values, list):
            raise _bad(field, f"{shown(values)} must be a list of addresses")
        out.extend((v, f"{field}[{i}]") for i, v in enumerate(values))
    # The conventions say a runtime that passes addresses in the config
    # means them to replace CNI_ARGS.
    if not out and cmd.args.get("IP"):
        out = [(v.strip(), "CNI_ARGS IP") for v in cmd.args["IP"].split(",")]
    return out


def requested_ips(cmd: CmdArgs, cfg: IPAMConfig) -> dict[int, Requested]:
    """The requested addresses keyed by the range set that must serve them."""
    out: dict[int, Requested] = {}
    for value, field in _requested_strings(cmd):
        if not isinstance(value, str):
            raise _bad(field, f"{shown(value)} must be an address string")
        text, _, prefix = value.partition("/")
        ip = _ip(text, field)
        found = cfg.locate(ip)
        if found is None:
            raise _bad(field, f"{ip} is not inside any configured range")
        rset, r = found
        if ip == r.gateway:
            raise _bad(field, f"{ip} is the gateway of {r.field}")
        if ip in r.skipped:
            raise _bad(field, f"{ip} is the network or broadcast address of {r.subnet}")
        if prefix and prefix != str(r.subnet.prefixlen):
            raise _bad(field, f"{value} has prefix /{prefix} but {r.field} is {r.subnet}")
        previous = out.get(rset.index)
        if previous is not None and previous.address != ip:
            raise _bad(
                field,
                f"{ip} and {previous.field} {previous.address} both fall in {rset.field}; one address per range set",
            )
        out[rset.index] = Requested(ip, field, r)
    return out
