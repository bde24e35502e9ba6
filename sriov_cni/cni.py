"""The CNI protocol, shared by the ``sriov`` plugin and the ``sriov-ipam`` plugin.

A plugin is a table of handlers, one per ``CNI_COMMAND``.  :func:`dispatch`
validates the environment and the network configuration, calls the handler,
and turns what it returns or raises into the protocol's stdout answer: a
result in the configuration's own version format, nothing, or an error
object.  Everything it needs comes in as arguments (environment mapping,
stdin, stdout) so tests call it in-process with a dict and ``io`` buffers.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import IO, Any

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
# libcni's skel reads a config without cniVersion (or with "") as 0.1.0,
# and NetworkAttachmentDefinitions without one exist (Multus' own examples).
UNVERSIONED = "0.1.0"
# Before 0.3.0 a result is one address per family ("ip4", "ip6"), no interfaces.
FIRST_LIST_RESULT = "0.3.0"

logger = logging.getLogger(__name__)


class Code(IntEnum):
    """Error codes: 1-99 are the spec's, 100+ are ours."""

    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODE = 6
    INVALID_CONFIG = 7
    INVALID_NETNS = 8
    TRY_AGAIN = 11
    NOT_AVAILABLE = 50
    LIMITED_CONNECTIVITY = 51
    # A device operation failed: netlink or sysfs refused a change.
    DEVICE = 100
    # No free VF in the configured pool.
    NO_FREE_VF = 101
    # A delegated IPAM plugin failed.
    IPAM = 102
    INTERNAL = 999


class CNIError(Exception):
    """A failure the runtime is told about as a CNI error object."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def to_dict(self, cni_version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg


# Reasons in the words of what happened, where the C library's mislead: the
# store's and safepath's paths are opened without following symlinks, so
# ELOOP means a symlink on the way, not a loop.
_IO_REASONS = {
    errno.ELOOP: "it goes through a symlink",
    errno.ENOTDIR: "a component is not a directory",
}


def io_error(exc: OSError, what: str = "") -> CNIError:
    """The CNI I/O error (code 74) for ``exc``: ``what`` failed (an action and its path), and why."""
    reason = _IO_REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
    return CNIError(Code.IO_FAILURE, f"{what}: {reason}" if what else reason)


def version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return (0,)


def version_at_least(version: str, minimum: str) -> bool:
    return version_tuple(version) >= version_tuple(minimum)


def config_version(conf: Mapping[str, Any]) -> Any:
    """The config's cniVersion as skel decodes it: missing or "" is 0.1.0."""
    version = conf.get("cniVersion")
    return UNVERSIONED if version is None or version == "" else version


# --- results ---------------------------------------------------------------

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass
class Interface:
    name: str
    mac: str = ""
    mtu: int = 0
    sandbox: str = ""
    pci_id: str = ""
    socket_path: str = ""


@dataclass
class IPConfig:
    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None


@dataclass
class Route:
    dst: IPNetwork
    gw: IPAddress | None = None
    mtu: int | None = None
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None


@dataclass
class DNS:
    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.domain:
            out["domain"] = self.domain
        if self.search:
            out["search"] = list(self.search)
        if self.options:
            out["options"] = list(self.options)
        return out

    @classmethod
    def from_dict(cls, raw: Any, what: str = "dns", code: int = Code.INVALID_CONFIG) -> DNS:
        if not isinstance(raw, dict):
            return cls()

        def strings(key: str) -> list[str]:
            value = raw.get(key) or []
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise CNIError(code, f"{what}.{key} must be a list of strings, got {shown(value)}")
            return list(value)

        domain = raw.get("domain") or ""
        if not isinstance(domain, str):
            raise CNIError(code, f"{what}.domain must be a string, got {shown(domain)}")
        return cls(
            nameservers=strings("nameservers"), domain=domain, search=strings("search"), options=strings("options")
        )


# Largest value of each optional route field the kernel takes (u32
# attributes, u8 scope): anything larger is refused while parsing, not by a
# struct.error deep inside the netlink encoder.
_ROUTE_EXTRA = {"mtu": 2**32 - 1, "advmss": 2**32 - 1, "priority": 2**32 - 1, "table": 2**32 - 1, "scope": 255}
# An interface MTU and a result's interface index are C ints.
_INT_MAX = 2**31 - 1


def shown(value: Any, limit: int = 80) -> str:
    """``value`` as JSON, cut to ``limit`` characters, for messages about configuration and other untrusted input.

    Written as the user wrote it: ``true``, ``null``, ``"on"`` (not Python's
    ``True``, ``None``, ``'on'``).  Non-ASCII and control characters are
    escaped, so the message stays one printable line.
    """
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        # What JSON has no form for (a YAML date, a circular structure).
        text = json.dumps(str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bounded_int(value: Any, what: str, high: int) -> int:
    """A JSON number (or numeric string) as an int in 0..high; ValueError otherwise.

    ``int()`` alone is not enough: ``1e400`` decodes to infinity
    (OverflowError), and a huge value only fails later in the kernel encoder.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what} {shown(value)} is not an integer")
    try:
        number = int(value)
    except (OverflowError, ValueError):
        raise ValueError(f"{what} {shown(value)} is not an integer") from None
    if isinstance(value, float) and number != value:
        raise ValueError(f"{what} {shown(value)} is not an integer")
    if not 0 <= number <= high:
        raise ValueError(f"{what} {number} is out of range 0-{high}")
    return number


@dataclass
class Result:
    """An ADD result; rendered in whichever spec version the config asked for."""

    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    def to_dict(self, cni_version: str) -> dict[str, Any]:
        if not version_at_least(cni_version, FIRST_LIST_RESULT):
            return self._legacy_dict(cni_version)
        v1 = version_at_least(cni_version, "1.0.0")
        v11 = version_at_least(cni_version, "1.1.0")
        out: dict[str, Any] = {"cniVersion": cni_version}
        if self.interfaces:
            ifaces = []
            for i in self.interfaces:
                d: dict[str, Any] = {"name": i.name}
                if i.mac:
                    d["mac"] = i.mac
                # mtu, socketPath and pciID exist from spec 1.1.0 on.
                if v11 and i.mtu:
                    d["mtu"] = i.mtu
                if i.sandbox:
                    d["sandbox"] = i.sandbox
                if v11 and i.socket_path:
                    d["socketPath"] = i.socket_path
                if v11 and i.pci_id:
                    d["pciID"] = i.pci_id
                ifaces.append(d)
            out["interfaces"] = ifaces
        ips = []
        for ip in self.ips:
            d = {"address": str(ip.address)}
            # Before 1.0.0 every IP entry must say which family it is.
            if not v1:
                d["version"] = str(ip.address.version)
            if ip.gateway is not None:
                d["gateway"] = str(ip.gateway)
            if ip.interface is not None:
                d["interface"] = ip.interface
            ips.append(d)
        if ips:
            out["ips"] = ips
        routes = []
        for r in self.routes:
            d = {"dst": str(r.dst)}
            if r.gw is not None:
                d["gw"] = str(r.gw)
            if v11:
                for key in _ROUTE_EXTRA:
                    value = getattr(r, key)
                    if value is not None:
                        d[key] = value
            routes.append(d)
        if routes:
            out["routes"] = routes
        dns = self.dns.to_dict()
        if dns:
            out["dns"] = dns
        return out

    def _legacy_dict(self, cni_version: str) -> dict[str, Any]:
        """The 0.1.0/0.2.0 form: the first address of each family, each with
        the routes of its family, as libcni converts a newer result."""
        out: dict[str, Any] = {"cniVersion": cni_version}
        for family in (4, 6):
            ip = next((i for i in self.ips if i.address.version == family), None)
            if ip is None:
                continue
            block: dict[str, Any] = {"ip": str(ip.address)}
            if ip.gateway is not None:
                block["gateway"] = str(ip.gateway)
            routes = [r for r in self.routes if r.dst.version == family]
            if routes:
                block["routes"] = [
                    {"dst": str(r.dst), **({"gw": str(r.gw)} if r.gw is not None else {})} for r in routes
                ]
            out[f"ip{family}"] = block
        dns = self.dns.to_dict()
        if dns:
            out["dns"] = dns
        return out

    @classmethod
    def from_dict(cls, raw: Any, what: str = "result") -> Result:
        """Parse a result of any supported version (an IPAM result or a prevResult)."""
        if not isinstance(raw, dict):
            raise CNIError(Code.DECODE, f"{what} is not a JSON object")
        if "ips" not in raw and ("ip4" in raw or "ip6" in raw):
            raw = _upgrade_legacy(raw)
        try:
            interfaces = [
                Interface(
                    name=str(i["name"]),
                    mac=str(i.get("mac") or ""),
                    mtu=bounded_int(i.get("mtu") or 0, "mtu", _INT_MAX),
                    sandbox=str(i.get("sandbox") or ""),
                    pci_id=str(i.get("pciID") or ""),
                    socket_path=str(i.get("socketPath") or ""),
                )
                for i in raw.get("interfaces") or []
            ]
            ips = [
                IPConfig(
                    address=ipaddress.ip_interface(str(ip["address"])),
                    gateway=ipaddress.ip_address(str(ip["gateway"])) if ip.get("gateway") else None,
                    interface=(
                        bounded_int(ip["interface"], "interface", _INT_MAX) if ip.get("interface") is not None else None
                    ),
                )
                for ip in raw.get("ips") or []
            ]
            routes = [
                Route(
                    dst=ipaddress.ip_network(str(r["dst"]), strict=False),
                    gw=ipaddress.ip_address(str(r["gw"])) if r.get("gw") else None,
                    **{k: bounded_int(r[k], k, high) for k, high in _ROUTE_EXTRA.items() if r.get(k) is not None},
                )
                for r in raw.get("routes") or []
            ]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CNIError(Code.DECODE, f"cannot parse {what}", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
        dns = DNS.from_dict(raw.get("dns"), f"{what}.dns", Code.DECODE)
        return cls(interfaces=interfaces, ips=ips, routes=routes, dns=dns)


def _upgrade_legacy(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.1.0/0.2.0 result (what IPAM plugins answer for such a config) in the list form."""
    ips: list[Any] = []
    routes: list[Any] = []
    for key in ("ip4", "ip6"):
        block = raw.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise CNIError(Code.DECODE, f"{key} of the result is not a JSON object")
        ips.append({"address": block.get("ip"), "gateway": block.get("gateway")})
        routes += block.get("routes") or []
    return {"ips": ips, "routes": routes, "dns": raw.get("dns")}


# --- invocation ------------------------------------------------------------

# libcni's rule for container IDs and network names; always used with
# fullmatch (a "$" would let a trailing newline through).
VALID_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")

# Deeper than any real configuration or result nests.  json's decoder
# recurses once per level, and so would everything that later walks,
# prints or copies the document: a hostile depth must fail at decoding.
MAX_JSON_DEPTH = 64


def _depth_ok(doc: Any) -> bool:
    # Iterative on purpose: recursion is exactly what a deep document exhausts.
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def decode_json(data: bytes | str, what: str, code: int = Code.DECODE) -> Any:
    """Parse untrusted JSON; any failure (bad syntax, bad UTF-8, hostile nesting) is a CNIError."""
    try:
        doc = json.loads(data)
        too_deep = not _depth_ok(doc)
    except RecursionError:
        too_deep = True
    except (ValueError, UnicodeDecodeError) as exc:
        raise CNIError(code, f"failed to decode {what}", str(exc)[:200]) from None
    if too_deep:
        raise CNIError(code, f"failed to decode {what}", f"nested deeper than {MAX_JSON_DEPTH} levels")
    return doc


# Variables each command needs non-empty.  CNI_PATH is only needed when a
# plugin is delegated to, so it is checked there, not here.
REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "GC": (),
    "STATUS": (),
}

# Commands that appeared after 0.3.0.
MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


@dataclass(frozen=True)
class CmdArgs:
    command: str
    container_id: str
    netns: str
    ifname: str
    args: Mapping[str, str]
    path: tuple[str, ...]
    stdin: bytes
    conf: Mapping[str, Any]
    cni_version: str
    env: Mapping[str, str]


Handler = Callable[[CmdArgs], Result | None]


def validate_ifname(name: str) -> str | None:
    """Why an interface name is unusable (libcni's rules and the kernel's), or None."""
    if not name:
        return "is empty"
    if not name.isascii() or not name.isprintable():
        # The kernel takes any byte, but a name that is not printable ASCII
        # cannot be logged, recorded or compared reliably (a non-UTF-8
        # byte arrives as a lone surrogate).
        return "must be printable ASCII"
    if len(name) > 15:
        return "is longer than 15 characters"
    if name in (".", ".."):
        return "cannot be . or .."
    if any(c in name for c in "/:") or any(c.isspace() for c in name):
        return "cannot contain '/', ':' or whitespace"
    if "%" in name:
        # The kernel expands a name with '%' as a template (net%d becomes
        # net0), so the interface would not have the name we record.
        return "cannot contain '%'"
    return None


def parse_cni_args(raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in filter(None, raw.split(";")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CNIError(Code.INVALID_ENV, "CNI_ARGS is malformed", f"{shown(pair)} is not KEY=VALUE")
        out[key] = value
    return out


def _env(env: Mapping[str, str], key: str) -> str:
    # Runtimes set every variable, some to "" (libcni's GC and STATUS):
    # empty means absent.
    return env.get(key, "") or ""


def _parse_invocation(env: Mapping[str, str], stdin: bytes) -> CmdArgs:
    command = _env(env, "CNI_COMMAND")
    if command not in REQUIRED_ENV:
        raise CNIError(Code.INVALID_ENV, f"unknown CNI_COMMAND: {command}")
    conf = decode_json(stdin, "the network configuration on stdin")
    if not isinstance(conf, dict):
        raise CNIError(Code.DECODE, "the network configuration on stdin is not a JSON object")
    version = config_version(conf)
    if not isinstance(version, str) or version not in SUPPORTED_VERSIONS:
        raise CNIError(
            Code.INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            f"config is {json.dumps(version)}, plugin supports {list(SUPPORTED_VERSIONS)}",
        )
    minimum = MIN_VERSION.get(command)
    if minimum and not version_at_least(version, minimum):
        raise CNIError(
            Code.INCOMPATIBLE_VERSION,
            f"config version {version} does not allow {command}",
            f"{command} needs cniVersion {minimum} or later",
        )
    missing = [k for k in REQUIRED_ENV[command] if not _env(env, k)]
    if missing:
        raise CNIError(Code.INVALID_ENV, f"required env variables [{','.join(missing)}] missing")
    container_id = _env(env, "CNI_CONTAINERID")
    if container_id and not VALID_NAME.fullmatch(container_id):
        raise CNIError(
            Code.INVALID_ENV,
            f"invalid CNI_CONTAINERID {shown(container_id)}",
            "must start with a letter or digit and hold only letters, digits, '_', '.' and '-'",
        )
    ifname = _env(env, "CNI_IFNAME")
    if ifname:
        why = validate_ifname(ifname)
        if why:
            raise CNIError(Code.INVALID_ENV, f"invalid CNI_IFNAME {shown(ifname)}: it {why}")
    netns = _env(env, "CNI_NETNS")
    if "\0" in netns or not netns.isprintable():
        raise CNIError(Code.INVALID_ENV, f"invalid CNI_NETNS {shown(netns)}: it must be a printable path")
    name = conf.get("name")
    if not isinstance(name, str) or not VALID_NAME.fullmatch(name):
        raise CNIError(
            Code.INVALID_CONFIG,
            f"invalid network name {shown(name)}",
            "must start with a letter or digit and hold only letters, digits, '_', '.' and '-'",
        )
    return CmdArgs(
        command=command,
        container_id=container_id,
        netns=netns,
        ifname=ifname,
        args=parse_cni_args(_env(env, "CNI_ARGS")),
        path=tuple(p for p in _env(env, "CNI_PATH").split(":") if p),
        stdin=stdin,
        conf=conf,
        cni_version=version,
        env=dict(env),
    )


def _requested_version(stdin: bytes) -> str:
    """The cniVersion a failed request asked for, to answer in; latest if unknown."""
    try:
        conf = decode_json(stdin, "stdin")
    except CNIError:
        return LATEST_VERSION
    version = config_version(conf) if isinstance(conf, dict) else None
    return version if isinstance(version, str) and version in SUPPORTED_VERSIONS else LATEST_VERSION


# The network configuration, prevResult included, is kilobytes.  Bounded,
# so a caller whose stdin never ends (/dev/zero) gets an error rather than
# a plugin growing until the node's OOM killer ends it.
MAX_CONFIG = 1 << 20


def read_config(stdin: IO[bytes]) -> bytes:
    """The plugin's stdin, read to its end but no further than :func:`dispatch` accepts."""
    return stdin.read(MAX_CONFIG + 1)


def _emit(stdout: IO[str], obj: Mapping[str, Any]) -> None:
    stdout.write(json.dumps(obj, indent=2) + "\n")
    stdout.flush()


def dispatch(
    handlers: Mapping[str, Handler],
    env: Mapping[str, str],
    stdin: bytes,
    stdout: IO[str],
    stderr: IO[str],
    about: str,
) -> int:
    """Run one CNI invocation; return the process exit status."""
    command = _env(env, "CNI_COMMAND")
    if not command:
        stderr.write(f"{about}\nCNI protocol versions supported: {', '.join(SUPPORTED_VERSIONS)}\n")
        return 0
    if len(stdin) > MAX_CONFIG:
        too_large = CNIError(
            Code.INVALID_CONFIG, f"the network configuration on stdin is larger than {MAX_CONFIG} bytes"
        )
        logger.error("%s failed: %s", command, too_large)
        _emit(stdout, too_large.to_dict(LATEST_VERSION))
        return 1
    if command == "VERSION":
        _emit(stdout, {"cniVersion": _requested_version(stdin), "supportedVersions": list(SUPPORTED_VERSIONS)})
        return 0
    try:
        cmd = _parse_invocation(env, stdin)
        handler = handlers.get(cmd.command)
        if handler is None:
            raise CNIError(Code.INVALID_ENV, f"{cmd.command} is not implemented by this plugin")
        result = handler(cmd)
    except CNIError as err:
        logger.error("%s failed: %s", command, err)
        _emit(stdout, err.to_dict(_requested_version(stdin)))
        return 1
    except Exception as exc:  # the runtime must get a CNI error object, never a traceback
        logger.exception("%s failed with an internal error", command)
        internal = CNIError(Code.INTERNAL, "internal error", f"{type(exc).__name__}: {exc}")
        _emit(stdout, internal.to_dict(_requested_version(stdin)))
        return 1
    if result is not None:
        _emit(stdout, result.to_dict(cmd.cni_version))
    return 0
