"""The ``sriov`` network configuration: parsing and validation.

Keys of the reference Go plugin keep their meaning (``deviceID``, ``mac``,
``vlan``, ``vlanQoS``, ``vlanProto``, ``spoofchk``, ``trust``, ``link_state``,
``min_tx_rate``, ``max_tx_rate``, ``logLevel``, ``logFile``, ``ipam``), so
existing NetworkAttachmentDefinitions work unchanged.  New: ``pfNames``
(self-allocation pool; ``master`` is the older single-PF spelling) and
``dataDir``.  Every check happens here, before anything on the node changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sriov_cni import netlink, safepath, sysfs
from sriov_cni.allocate import PoolEntry, parse_pool_entry
from sriov_cni.cni import DNS, CmdArgs, CNIError, Code, Result, short_repr
from sriov_cni.store import DEFAULT_DATA_DIR

_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")

VLAN_PROTOS = {"802.1q": netlink.VLAN_PROTO_8021Q, "802.1ad": netlink.VLAN_PROTO_8021AD}
LINK_STATES = {
    "auto": netlink.LINK_STATE_AUTO,
    "enable": netlink.LINK_STATE_ENABLE,
    "disable": netlink.LINK_STATE_DISABLE,
}
LOG_LEVELS = ("panic", "error", "warning", "info", "debug")


@dataclass(frozen=True)
class NetConf:
    cni_version: str
    name: str
    device_id: str | None
    pool: tuple[PoolEntry, ...]
    mac: str | None
    vlan: int | None
    vlan_qos: int | None
    vlan_proto: int | None
    spoofchk: bool | None
    trust: bool | None
    link_state: int | None
    min_tx_rate: int | None
    max_tx_rate: int | None
    log_level: str
    log_file: str | None
    ipam: Mapping[str, Any] | None
    data_dir: str
    dns: DNS
    prev_result: Result | None


def _invalid(msg: str, details: str = "") -> CNIError:
    return CNIError(Code.INVALID_CONFIG, msg, details)


def _int(conf: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = conf.get(key)
    if value is None:
        return None
    # bool is an int in Python; true/false for a number is a config mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{key} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise _invalid(f"{key} {value} invalid: value must be in the range {low}-{high}")
    return value


def _str(conf: Mapping[str, Any], key: str) -> str | None:
    value = conf.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _invalid(f"{key} must be a string, got {value!r}")
    return value


def _on_off(conf: Mapping[str, Any], key: str) -> bool | None:
    value = _str(conf, key)
    if value is None:
        return None
    if value.lower() not in ("on", "off"):
        raise _invalid(f'{key} must be "on" or "off", got {value!r}')
    return value.lower() == "on"


def _mac(value: str, where: str) -> str:
    mac = value.strip().lower()
    if not _MAC.fullmatch(mac):
        raise _invalid(f"{where} {value!r} is not a MAC address (expected six hex pairs like 02:00:00:00:00:01)")
    if int(mac[:2], 16) & 1:
        raise _invalid(f"{where} {value!r} is a multicast address; a VF needs a unicast MAC")
    return mac


def _pool(conf: Mapping[str, Any]) -> tuple[PoolEntry, ...]:
    raw = conf.get("pfNames")
    entries: list[str] = []
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(e, str) and e for e in raw):
            raise _invalid(f"pfNames must be a list of PF names or PCI addresses, got {raw!r}")
        entries.extend(raw)
    master = _str(conf, "master")
    if master:
        entries.append(master)
    try:
        return tuple(parse_pool_entry(e) for e in entries)
    except ValueError as exc:
        raise _invalid(f"pfNames: {exc}") from exc


def _device_id(conf: Mapping[str, Any]) -> str | None:
    # A device plugin's choice arrives as runtimeConfig.deviceID (capability)
    # or, from Multus, as top-level deviceID and pciBusID.
    runtime = conf.get("runtimeConfig")
    candidates: list[tuple[str, Any]] = []
    if isinstance(runtime, Mapping):
        candidates.append(("runtimeConfig.deviceID", runtime.get("deviceID")))
    candidates += [("deviceID", conf.get("deviceID")), ("pciBusID", conf.get("pciBusID"))]
    for key, value in candidates:
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not sysfs.is_pci_address(value):
            raise _invalid(f"{key} must be a PCI address like 0000:3b:02.0, got {short_repr(value)}")
        return value.lower()
    return None


def _effective_mac(conf: Mapping[str, Any], cni_args: Mapping[str, str]) -> str | None:
    # Same precedence as the reference plugin: config, then CNI_ARGS MAC,
    # then the runtime's mac capability.
    mac = _str(conf, "mac")
    where = "mac"
    if cni_args.get("MAC"):
        mac, where = cni_args["MAC"], "CNI_ARGS MAC"
    runtime = conf.get("runtimeConfig")
    if isinstance(runtime, Mapping) and runtime.get("mac"):
        value = runtime["mac"]
        if not isinstance(value, str):
            raise _invalid(f"runtimeConfig.mac must be a string, got {value!r}")
        mac, where = value, "runtimeConfig.mac"
    return _mac(mac, where) if mac else None


def load_common(cmd: CmdArgs) -> tuple[str, str, str | None, Mapping[str, Any] | None]:
    """What DEL and GC need even when the rest of the config is bad:
    data directory, log level, log file and IPAM section."""
    conf = cmd.conf
    data_dir = safepath.absolute(_str(conf, "dataDir") or DEFAULT_DATA_DIR, "dataDir")
    log_file = _str(conf, "logFile")
    level = (_str(conf, "logLevel") or "info").lower()
    if level not in LOG_LEVELS:
        # The reference plugin falls back the same way; refusing would break
        # existing NetworkAttachmentDefinitions over a log setting.
        level = "info"
    ipam = conf.get("ipam")
    if ipam is not None and not isinstance(ipam, Mapping):
        raise _invalid(f"ipam must be an object, got {ipam!r}")
    if ipam is not None and not ipam:
        ipam = None
    if ipam is not None and not (isinstance(ipam.get("type"), str) and ipam["type"]):
        raise _invalid("ipam.type must name an IPAM plugin")
    return data_dir, level, log_file and safepath.absolute(log_file, "logFile"), ipam


def load(cmd: CmdArgs) -> NetConf:
    conf = cmd.conf
    data_dir, level, log_file, ipam = load_common(cmd)
    device_id = _device_id(conf)
    pool = _pool(conf)
    if device_id is None and not pool:
        raise _invalid(
            "no VF source: set pfNames (PFs to allocate a VF from) or deviceID (a VF chosen by a device plugin)"
        )

    vlan = _int(conf, "vlan", 0, 4094)
    qos = _int(conf, "vlanQoS", 0, 7)
    proto_name = _str(conf, "vlanProto")
    if vlan is None and (qos is not None or proto_name is not None):
        raise _invalid("vlan id must be configured to set vlanQoS or vlanProto")
    if vlan == 0 and qos:
        raise _invalid("vlan id must be non-zero to set a non-zero vlanQoS")
    proto: int | None = None
    if proto_name is not None:
        proto = VLAN_PROTOS.get(proto_name.lower())
        if proto is None:
            raise _invalid(f'vlanProto must be "802.1q" or "802.1ad", got {proto_name!r}')
        if vlan == 0 and proto == netlink.VLAN_PROTO_8021AD:
            raise _invalid("vlan id must be non-zero to use vlanProto 802.1ad")
    if vlan is not None:
        qos = qos or 0
        proto = proto or netlink.VLAN_PROTO_8021Q

    link_state_name = _str(conf, "link_state")
    link_state: int | None = None
    if link_state_name is not None:
        link_state = LINK_STATES.get(link_state_name.lower())
        if link_state is None:
            raise _invalid(f'link_state must be "auto", "enable" or "disable", got {link_state_name!r}')

    min_rate = _int(conf, "min_tx_rate", 0, 2**32 - 1)
    max_rate = _int(conf, "max_tx_rate", 0, 2**32 - 1)
    if min_rate and max_rate and min_rate > max_rate:
        raise _invalid(f"min_tx_rate {min_rate} is above max_tx_rate {max_rate}")

    prev: Result | None = None
    if conf.get("prevResult") is not None:
        prev = Result.from_dict(conf["prevResult"], "prevResult")

    return NetConf(
        cni_version=cmd.cni_version,
        name=str(conf["name"]),
        device_id=device_id,
        pool=pool,
        mac=_effective_mac(conf, cmd.args),
        vlan=vlan,
        vlan_qos=qos,
        vlan_proto=proto,
        spoofchk=_on_off(conf, "spoofchk"),
        trust=_on_off(conf, "trust"),
        link_state=link_state,
        min_tx_rate=min_rate,
        max_tx_rate=max_rate,
        log_level=level,
        log_file=log_file,
        ipam=ipam,
        data_dir=data_dir,
        dns=DNS.from_dict(conf.get("dns")),
        prev_result=prev,
    )
