"""The node config file that ``sriov-cni setup`` reads (YAML); the only module importing yaml.

Example (every key but ``pfs``, ``pf`` and ``numVfs`` optional)::

    irqbalance: ban           # ban (default), stop or leave: see IRQBALANCE_MODES
    rdmaNetnsMode: exclusive  # exclusive or shared (absent: the node's mode is left alone)
    pfs:
      - pf: ens1f0            # netdev name or PCI address
        numVfs: 7
        mtu: 9000             # PF MTU is raised to this, never lowered
        vfDriver: kernel      # kernel (default), or vfio-pci or uio_pci_generic (DPDK)
        adminMacs: true       # each VF an admin MAC, then its driver rebound (default false):
                              # mlx5 VFs start with node GUID 0, which rdma_cm cannot use
        tuning:               # absent: IRQs and queues are left to the kernel
          irqCpus: local      # local (NUMA node of the PF, default) or a cpulist "2-7"
          excludeCpus: "0"    # removed from irqCpus; isolated CPUs always are
          rps: true           # RPS on every rx queue (default false)
          rpsCpus: "2-7"      # default: the IRQ CPUs
          rfsFlowEntries: 32768  # RFS table size (default 0: off; needs rps)
          xps: true           # each tx queue to its IRQ's CPU (default false)

Every error is one line naming the field, e.g. ``pfs[1].numVfs: must be an
integer >= 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sriov_cni.cni import shown
from sriov_cni.kernel import cpulist

VF_DRIVERS = ("kernel", "vfio-pci", "uio_pci_generic")
# What setup does about irqbalance, which would move the pinned IRQs back:
# ban keeps it running but off the tuned PFs' and their VFs' IRQs (through
# its policy script), stop stops it, leave only warns.
IRQBALANCE_MODES = ("ban", "stop", "leave")
# The kernel's RDMA netns modes (see node.rdmamode).
RDMA_NETNS_MODES = ("exclusive", "shared")


class NodeConfigError(Exception):
    pass


@dataclass(frozen=True)
class TuningSpec:
    irq_cpus: list[int] | None  # None: NUMA-local
    exclude_cpus: list[int]
    rps: bool
    rps_cpus: list[int] | None  # None: same as the IRQ CPUs
    rfs_flow_entries: int
    xps: bool


@dataclass(frozen=True)
class PfSpec:
    pf: str
    num_vfs: int
    mtu: int | None
    vf_driver: str
    tuning: TuningSpec | None
    admin_macs: bool = False


@dataclass(frozen=True)
class NodeConfig:
    pfs: list[PfSpec]
    irqbalance: str = "ban"
    rdma_netns_mode: str | None = None  # None: setup leaves the node's mode and boot option alone


def _keys(raw: Any, where: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise NodeConfigError(f"{where}: must be a mapping")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise NodeConfigError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(raw))
    if missing:
        raise NodeConfigError(f"{where}.{missing[0]}: required")
    return raw


def _int(raw: dict[str, Any], key: str, where: str, default: int | None, low: int, high: int) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    # bool is an int in Python; "numVfs: yes" is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise NodeConfigError(f"{where}.{key}: must be an integer from {low} to {high}, got {shown(value)}")
    return value


def _bool(raw: dict[str, Any], key: str, where: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise NodeConfigError(f"{where}.{key}: must be true or false, got {shown(value)}")
    return value


def _cpus(raw: dict[str, Any], key: str, where: str) -> list[int] | None:
    value = raw.get(key)
    if value is None:
        return None
    # YAML reads a lone CPU number as an int.
    try:
        cpus = cpulist.parse_list(str(value))
    except cpulist.CpuListError as exc:
        raise NodeConfigError(f"{where}.{key}: {exc}") from None
    if not cpus:
        raise NodeConfigError(f"{where}.{key}: names no CPU")
    return cpus


def _tuning(raw: Any, where: str) -> TuningSpec:
    raw = _keys(raw, where, {"irqCpus", "excludeCpus", "rps", "rpsCpus", "rfsFlowEntries", "xps"}, set())
    irq_cpus = None if raw.get("irqCpus", "local") == "local" else _cpus(raw, "irqCpus", where)
    rps = _bool(raw, "rps", where)
    rfs = _int(raw, "rfsFlowEntries", where, 0, 0, 1 << 30) or 0
    if rfs and not rps:
        raise NodeConfigError(f"{where}.rfsFlowEntries: RFS steers through RPS; set rps: true too")
    if "rpsCpus" in raw and not rps:
        raise NodeConfigError(f"{where}.rpsCpus: given while rps is off; set rps: true or drop it")
    return TuningSpec(
        irq_cpus=irq_cpus,
        exclude_cpus=_cpus(raw, "excludeCpus", where) or [],
        rps=rps,
        rps_cpus=_cpus(raw, "rpsCpus", where),
        rfs_flow_entries=rfs,
        xps=_bool(raw, "xps", where),
    )


def _pf(raw: Any, where: str) -> PfSpec:
    raw = _keys(raw, where, {"pf", "numVfs", "mtu", "vfDriver", "tuning", "adminMacs"}, {"pf", "numVfs"})
    name = raw["pf"]
    if not isinstance(name, str) or not name:
        raise NodeConfigError(f"{where}.pf: must be a netdev name or PCI address")
    driver = raw.get("vfDriver", "kernel")
    if driver not in VF_DRIVERS:
        raise NodeConfigError(f"{where}.vfDriver: must be one of {', '.join(VF_DRIVERS)}, got {shown(driver)}")
    num_vfs = _int(raw, "numVfs", where, None, 0, 65535)
    assert num_vfs is not None  # required above
    return PfSpec(
        pf=name,
        num_vfs=num_vfs,
        mtu=_int(raw, "mtu", where, None, 68, 65535),
        vf_driver=driver,
        tuning=_tuning(raw["tuning"], f"{where}.tuning") if raw.get("tuning") is not None else None,
        admin_macs=_bool(raw, "adminMacs", where),
    )


def parse(text: str) -> NodeConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise NodeConfigError(f"not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    raw = _keys(raw, "config", {"pfs", "irqbalance", "rdmaNetnsMode"}, {"pfs"})
    irqbalance = raw.get("irqbalance", "ban")
    if irqbalance not in IRQBALANCE_MODES:
        raise NodeConfigError(f"irqbalance: must be one of {', '.join(IRQBALANCE_MODES)}, got {shown(irqbalance)}")
    rdma_mode = raw.get("rdmaNetnsMode")
    if rdma_mode is not None and rdma_mode not in RDMA_NETNS_MODES:
        raise NodeConfigError(f"rdmaNetnsMode: must be one of {', '.join(RDMA_NETNS_MODES)}, got {shown(rdma_mode)}")
    pfs = raw["pfs"]
    if not isinstance(pfs, list) or not pfs:
        raise NodeConfigError("pfs: must be a non-empty list")
    specs = [_pf(item, f"pfs[{i}]") for i, item in enumerate(pfs)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.pf in seen:
            raise NodeConfigError(f"pfs[{i}].pf: {spec.pf} is already configured in pfs[{seen[spec.pf]}]")
        seen[spec.pf] = i
    return NodeConfig(pfs=specs, irqbalance=irqbalance, rdma_netns_mode=rdma_mode)


def load(path: Path) -> NodeConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise NodeConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return parse(text)
    except NodeConfigError as exc:
        raise NodeConfigError(f"{path}: {exc}") from None
