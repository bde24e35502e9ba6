"""The ``sriov`` network configuration: parsing and validation.

Keys of the reference Go plugin keep their meaning (``deviceID``, ``mac``,
``vlan``, ``vlanQoS``, ``vlanProto``, ``spoofchk``, ``trust``, ``link_state``,
``min_tx_rate``, ``max_tx_rate``, ``logLevel``, ``logFile``, ``ipam``), so
existing NetworkAttachmentDefinitions work unchanged.  New: ``pfNames``
(self-allocation pool; ``master`` is the older single-PF spelling) and
``dataDir``.  Every check happens here, before anything on the node changes.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sriov_cni import safepath, sizes
from sriov_cni.cni import DNS, FIRST_LIST_RESULT, CmdArgs, CNIError, Code, Result, shown, version_at_least
from sriov_cni.kernel import sysfs, vfsettings
from sriov_cni.kernel.vfsettings import PfSettings, Rate, Vlan
from sriov_cni.plugin.pool import PoolEntry, parse_pool_entry
from sriov_cni.vfstore import DEFAULT_DATA_DIR

_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")

VLAN_PROTOS = {"802.1q": vfsettings.VLAN_PROTO_8021Q, "802.1ad": vfsettings.VLAN_PROTO_8021AD}
LINK_STATES = {
    "auto": vfsettings.LINK_STATE_AUTO,
    "enable": vfsettings.LINK_STATE_ENABLE,
    "disable": vfsettings.LINK_STATE_DISABLE,
}
LOG_LEVELS = ("panic", "error", "warning", "info", "debug")
DEFAULT_LOG_LEVEL = "info"
RDMA_MODES = ("auto", "required", "off", "soft")

# Besides ASCII case, Go's encoding/json folds the Kelvin sign onto "k" and
# the long s onto "s" when it matches keys.
_GO_FOLD = str.maketrans({"\u212a": "k", "\u017f": "s"})


def _fold(key: str) -> str:
    return key.translate(_GO_FOLD).lower()


@dataclass
class Notes:
    """What reading the config found worth logging; logged once logging is configured."""

    entries: list[tuple[int, str]] = field(default_factory=list)

    def add(self, level: int, msg: str) -> None:
        # A section read by several checks (runtimeConfig) would repeat its note.
        if (level, msg) not in self.entries:
            self.entries.append((level, msg))


class Keys:
    """A config object read the way the reference plugin's Go decoder reads it.

    encoding/json matches keys case-insensitively, so NADs written for the
    reference say "Vlan", "MAC" or "spoofChk" and mean it.  The exact
    spelling wins when present; otherwise the last case-insensitive match
    (Go's decoder lets the last matching key win).  Every other spelling
    used or ignored is noted, so a surprising setting can be traced.
    """

    def __init__(self, raw: Mapping[str, Any], notes: Notes, prefix: str = "") -> None:
        self.raw = raw
        self.notes = notes
        self.prefix = prefix
        # Every spelling of each folded key, in the config's order, made once:
        # a config is asked for some twenty keys, and a scan of its keys for
        # each would cost twenty times a config of many keys.
        self._spellings: dict[str, list[str]] = {}
        for k in raw:
            self._spellings.setdefault(_fold(k), []).append(k)
        # Every key asked for, as the code spells it: what this plugin reads.
        self.asked: list[str] = []

    def get(self, key: str) -> Any:
        if key not in self.asked:
            self.asked.append(key)
        others = [k for k in self._spellings.get(_fold(key), ()) if k != key]
        if key in self.raw:
            for other in others:
                self.notes.add(
                    logging.WARNING, f"ignoring {shown(self.prefix + other)}: {shown(self.prefix + key)} is set too"
                )
            return self.raw[key]
        if not others:
            return None
        used = others[-1]
        self.notes.add(logging.INFO, f"reading {shown(self.prefix + used)} as {shown(self.prefix + key)}")
        return self.raw[used]

    def section(self, key: str) -> Keys | None:
        value = self.get(key)
        return Keys(value, self.notes, f"{self.prefix}{key}.") if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class NetConf:
    cni_version: str
    name: str
    device_id: str | None
    pool: tuple[PoolEntry, ...]
    # What ADD sets at the PF; its mac is also the pod netdev's.
    pf_settings: PfSettings
    log_level: str
    log_file: str | None
    ipam_type: str | None
    data_dir: str
    dns: DNS
    prev_result: Result | None
    notes: tuple[tuple[int, str], ...] = ()
    # runtimeConfig.CNIDeviceInfoFile: where the pod's device information is
    # read and written (see sriov_cni.deviceinfo); None when not passed.
    device_info_file: str | None = None
    # What happens to the VF's RDMA device: plugin/rdma.py.
    rdma: str = "auto"
    # RLIMIT_MEMLOCK for the pod's containers when it gets an RDMA device
    # (rdmaMemlock, recorded for the daemon's NRI plugin); None: unlimited.
    rdma_memlock: int | None = None


def _invalid(msg: str, details: str = "") -> CNIError:
    return CNIError(Code.INVALID_CONFIG, msg, details)


def _int(conf: Keys, key: str, low: int, high: int) -> int | None:
    value = conf.get(key)
    if value is None:
        return None
    # bool is an int in Python; true/false for a number is a config mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(f"{key} must be an integer, got {shown(value)}")
    if not low <= value <= high:
        raise _invalid(f"{key} {value} invalid: value must be in the range {low}-{high}")
    return value


def _str(conf: Keys, key: str) -> str | None:
    value = conf.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _invalid(f"{conf.prefix}{key} must be a string, got {shown(value)}")
    return value


def _on_off(conf: Keys, key: str) -> bool | None:
    """On only for exactly "on", off for any other non-empty string, as the
    reference applies it: an existing NAD saying "ON" or "true" gets what it
    got there, with a warning that it is not what it probably means."""
    value = _str(conf, key)
    if value is None:
        return None
    if value not in ("on", "off"):
        conf.notes.add(
            logging.WARNING,
            f'{key} {shown(value)} turns {key} off: only exactly "on" turns it on (write "on" or "off")',
        )
    return value == "on"


def _mac(value: str, where: str) -> str:
    mac = value.strip().lower()
    if not _MAC.fullmatch(mac):
        raise _invalid(f"{where} {shown(value)} is not a MAC address (expected six hex pairs like 02:00:00:00:00:01)")
    if int(mac[:2], 16) & 1:
        raise _invalid(f"{where} {shown(value)} is a multicast address; a VF needs a unicast MAC")
    return mac


def _pool(conf: Keys) -> tuple[PoolEntry, ...]:
    raw = conf.get("pfNames")
    entries: list[str] = []
    if raw is not None:
        if not isinstance(raw, list) or not all(isinstance(e, str) and e for e in raw):
            raise _invalid(f"pfNames must be a list of PF names or PCI addresses, got {shown(raw)}")
        entries.extend(raw)
    master = _str(conf, "master")
    if master:
        entries.append(master)
    try:
        return tuple(parse_pool_entry(e) for e in entries)
    except ValueError as exc:
        raise _invalid(f"pfNames: {exc}") from exc


def _device_id(conf: Keys) -> str | None:
    # A device plugin's choice arrives as runtimeConfig.deviceID (capability)
    # or, from Multus, as top-level deviceID and pciBusID.
    runtime = conf.section("runtimeConfig")
    candidates: list[tuple[str, Any]] = []
    if runtime is not None:
        candidates.append(("runtimeConfig.deviceID", runtime.get("deviceID")))
    candidates += [("deviceID", conf.get("deviceID")), ("pciBusID", conf.get("pciBusID"))]
    for key, value in candidates:
        if value is None or value == "":
            continue
        if not isinstance(value, str) or not sysfs.is_pci_address(value):
            raise _invalid(f"{key} must be a PCI address like 0000:3b:02.0, got {shown(value)}")
        return value.lower()
    return None


def _device_info_file(conf: Keys) -> str | None:
    runtime = conf.section("runtimeConfig")
    path = _str(runtime, "CNIDeviceInfoFile") if runtime is not None else None
    return path and safepath.absolute(path, "runtimeConfig.CNIDeviceInfoFile")


def _effective_mac(conf: Keys, cni_args: Mapping[str, str]) -> str | None:
    # Same precedence as the reference plugin: config, then CNI_ARGS MAC,
    # then the runtime's mac capability.
    mac = _str(conf, "mac")
    where = "mac"
    if cni_args.get("MAC"):
        mac, where = cni_args["MAC"], "CNI_ARGS MAC"
    runtime = conf.section("runtimeConfig")
    if runtime is not None and runtime.get("mac"):
        value = runtime.get("mac")
        if not isinstance(value, str):
            raise _invalid(f"runtimeConfig.mac must be a string, got {shown(value)}")
        mac, where = value, "runtimeConfig.mac"
    return _mac(mac, where) if mac else None


@dataclass(frozen=True)
class Common:
    """What DEL and GC need even when the rest of the config is bad."""

    data_dir: str
    log_level: str
    log_file: str | None
    # The IPAM plugin to run, None for none.
    ipam_type: str | None
    notes: tuple[tuple[int, str], ...]


def _common(conf: Keys) -> Common:
    data_dir = safepath.absolute(_str(conf, "dataDir") or DEFAULT_DATA_DIR, "dataDir")
    given = _str(conf, "logLevel")
    level = (given or DEFAULT_LOG_LEVEL).lower()
    if level not in LOG_LEVELS:
        # The reference plugin falls back the same way; refusing would break
        # existing NetworkAttachmentDefinitions over a log setting.
        conf.notes.add(
            logging.WARNING,
            f"logLevel {json.dumps(given)} is not one of {', '.join(json.dumps(v) for v in LOG_LEVELS)}: "
            f"logging at {json.dumps(DEFAULT_LOG_LEVEL)}",
        )
        level = DEFAULT_LOG_LEVEL
    ipam = conf.get("ipam")
    if ipam is not None and not isinstance(ipam, Mapping):
        raise _invalid(f"ipam must be an object, got {shown(ipam)}")
    # As in the reference, an ipam section without a type runs no IPAM.
    ipam_type = _str(Keys(ipam, conf.notes, "ipam."), "type") if ipam is not None else None
    log_file = _str(conf, "logFile")
    log_file = log_file and safepath.absolute(log_file, "logFile")
    return Common(data_dir, level, log_file, ipam_type, tuple(conf.notes.entries))


def load_common(cmd: CmdArgs) -> Common:
    return _common(Keys(cmd.conf, Notes()))


def _check_result_version(cmd: CmdArgs, common: Common) -> None:
    if common.ipam_type is None and not version_at_least(cmd.cni_version, FIRST_LIST_RESULT):
        # The reference configures the VF and then fails to print the result.
        raise CNIError(
            Code.INCOMPATIBLE_VERSION,
            f"a cniVersion {cmd.cni_version} result can only report IP addresses, and this network has no IPAM",
            f"set cniVersion {FIRST_LIST_RESULT} or later, or configure ipam",
        )


def _vf_source(conf: Keys) -> tuple[str | None, tuple[PoolEntry, ...]]:
    """The VF a device plugin chose, and the pool to allocate from; one of them at least."""
    device_id = _device_id(conf)
    pool = _pool(conf)
    if device_id is None and not pool:
        raise _invalid(
            "no VF source: set pfNames (PFs to allocate a VF from) or deviceID (a VF chosen by a device plugin)"
        )
    return device_id, pool


def _vlan(conf: Keys) -> Vlan | None:
    vlan = _int(conf, "vlan", 0, 4094)
    qos = _int(conf, "vlanQoS", 0, 7)
    # Unlike the other strings, an empty vlanProto counts as given (and is
    # refused), as in the reference, where it is a non-nil pointer.
    proto_name = conf.get("vlanProto")
    if proto_name is not None and not isinstance(proto_name, str):
        raise _invalid(f"vlanProto must be a string, got {shown(proto_name)}")
    if vlan is None and (qos is not None or proto_name is not None):
        raise _invalid("vlan id must be configured to set vlanQoS or vlanProto")
    if vlan == 0 and qos:
        raise _invalid("vlan id must be non-zero to set a non-zero vlanQoS")
    proto: int | None = None
    if proto_name is not None:
        proto = VLAN_PROTOS.get(proto_name.lower())
        if proto is None:
            raise _invalid(f'vlanProto must be "802.1q" or "802.1ad", got {shown(proto_name)}')
        if vlan == 0 and proto == vfsettings.VLAN_PROTO_8021AD:
            raise _invalid("vlan id must be non-zero to use vlanProto 802.1ad")
    if vlan is None:
        return None
    return Vlan(vlan, qos or 0, proto or vfsettings.VLAN_PROTO_8021Q)


def _link_state(conf: Keys) -> int | None:
    name = _str(conf, "link_state")
    if name is None:
        return None
    state = LINK_STATES.get(name.lower())
    if state is None:
        raise _invalid(f'link_state must be "auto", "enable" or "disable", got {shown(name)}')
    return state


def _rate(conf: Keys) -> Rate | None:
    min_rate = _int(conf, "min_tx_rate", 0, 2**32 - 1)
    max_rate = _int(conf, "max_tx_rate", 0, 2**32 - 1)
    if min_rate and max_rate and min_rate > max_rate:
        raise _invalid(f"min_tx_rate {min_rate} is above max_tx_rate {max_rate}")
    if min_rate is None and max_rate is None:
        return None
    # One request carries both limits; the one not configured is sent as 0
    # (no limit), as the reference does.  The record keeps the VF's original
    # pair, so DEL restores both.
    return Rate(min_rate or 0, max_rate or 0)


def _rdma(conf: Keys) -> str:
    mode = _str(conf, "rdma")
    if mode is None:
        return "auto"
    if mode not in RDMA_MODES:
        raise _invalid(f'rdma must be "auto", "required", "off" or "soft", got {shown(mode)}')
    return mode


def _rdma_memlock(conf: Keys) -> int | None:
    value = conf.get("rdmaMemlock")
    if value is None or value == "unlimited":
        return None
    size = sizes.parse(value) if isinstance(value, str) else None
    if size is None:
        raise _invalid(
            f'rdmaMemlock must be "unlimited" or a size such as "64Mi" ({sizes.EXPECTED}), got {shown(value)}'
        )
    return size


def _prev_result(cmd: CmdArgs) -> Result | None:
    if cmd.conf.get("prevResult") is None:
        return None
    return Result.from_dict(cmd.conf["prevResult"], "prevResult")


# Top-level keys read outside Keys, or by no one here but valid in any
# plugin's config: the CNI spec's (libcni and Multus deliver them).
SPEC_KEYS = ("cniVersion", "name", "type", "args", "capabilities", "runtimeConfig", "prevResult", "ipam", "dns")
# Keys the reference plugin's decoder takes (fields without a JSON tag)
# without applying them from a NAD: MTU is overwritten with the VF's own,
# the others are its cached state.  Not misspellings, so not "unknown".
REFERENCE_UNUSED = ("MTU", "OrigVfState", "VFID")


def _unknown_keys(conf: Keys) -> None:
    """Note the top-level keys no reader asked for, once every reader has run.

    The known keys are those ``conf`` was asked for (so the list follows
    the code that reads them) plus SPEC_KEYS; keys match as the reference
    matches them, case-insensitively.  Never a failure: the reference
    ignores unknown keys too.
    """
    readable = [*conf.asked, *(k for k in SPEC_KEYS if k not in conf.asked)]
    known = {_fold(k) for k in readable}
    unused = {_fold(k): k for k in REFERENCE_UNUSED}
    unknown, ignored = [], []
    for key in conf.raw:
        folded = _fold(key)
        if folded in known:
            continue
        if folded in unused:
            ignored.append(json.dumps(key))
            continue
        close = difflib.get_close_matches(folded, [_fold(k) for k in readable], n=1, cutoff=0.7)
        hint = "" if not close else f" (did you mean {json.dumps(next(k for k in readable if _fold(k) == close[0]))}?)"
        unknown.append(f"{json.dumps(key)}{hint}")
    if unknown:
        conf.notes.add(logging.WARNING, f"ignoring unknown keys: {', '.join(unknown)}")
    if ignored:
        conf.notes.add(
            logging.INFO,
            f"ignoring {', '.join(ignored)}: the reference plugin reads it from a network config but never "
            "applies it, and neither does this one",
        )


def load(cmd: CmdArgs) -> NetConf:
    conf = Keys(cmd.conf, Notes())
    common = _common(conf)
    _check_result_version(cmd, common)
    device_id, pool = _vf_source(conf)
    # Read in the order they always were: a config with several mistakes is
    # refused for the same one, and its notes are logged in the same order.
    vlan = _vlan(conf)
    link_state = _link_state(conf)
    rate = _rate(conf)
    rdma = _rdma(conf)
    rdma_memlock = _rdma_memlock(conf)
    prev = _prev_result(cmd)
    settings = PfSettings(
        vlan=vlan,
        mac=_effective_mac(conf, cmd.args),
        rate=rate,
        spoofchk=_on_off(conf, "spoofchk"),
        trust=_on_off(conf, "trust"),
        link_state=link_state,
    )
    dns = DNS.from_dict(conf.get("dns"))
    device_info_file = _device_info_file(conf)
    # Last: every key this plugin reads has been asked for by now.
    _unknown_keys(conf)
    return NetConf(
        cni_version=cmd.cni_version,
        name=str(cmd.conf["name"]),
        device_id=device_id,
        pool=pool,
        pf_settings=settings,
        log_level=common.log_level,
        log_file=common.log_file,
        ipam_type=common.ipam_type,
        data_dir=common.data_dir,
        dns=dns,
        prev_result=prev,
        notes=tuple(conf.notes.entries),
        device_info_file=device_info_file,
        rdma=rdma,
        rdma_memlock=rdma_memlock,
    )
