"""Which CPUs a PF's queue IRQs go to: NUMA-local, minus excluded and isolated CPUs."""

from __future__ import annotations

from pathlib import Path

from sriov_cni.kernel import cpulist, sysfs
from sriov_cni.nodestate import TuningError


def _cpu_file(sys_root: Path, name: str) -> list[int]:
    try:
        text = (sys_root / "devices" / "system" / "cpu" / name).read_text().strip()
    except OSError:
        return []
    # Kernels built with NO_HZ_FULL but booted without nohz_full= print
    # "(null)" in the nohz_full file rather than an empty list.
    if text == "(null)":
        return []
    return cpulist.parse_list(text)


def online_cpus(sys_root: Path) -> list[int]:
    return _cpu_file(sys_root, "online")


def isolated_cpus(sys_root: Path) -> list[int]:
    """CPUs the kernel keeps free of housekeeping: ``isolcpus=`` and ``nohz_full=``."""
    return sorted(set(_cpu_file(sys_root, "isolated")) | set(_cpu_file(sys_root, "nohz_full")))


def numa_node(sys_root: Path, pci: str) -> int:
    try:
        return sysfs.read_int(sysfs.pci_dir(sys_root, pci) / "numa_node")
    except sysfs.SysfsError:
        return -1


def local_cpus(sys_root: Path, pci: str) -> list[int]:
    """CPUs nearest the device: its NUMA node's, else ``local_cpulist``, else every online CPU."""
    online = online_cpus(sys_root)
    node = numa_node(sys_root, pci)
    path = (
        sys_root / "devices" / "system" / "node" / f"node{node}" / "cpulist"
        if node >= 0
        else sysfs.pci_dir(sys_root, pci) / "local_cpulist"
    )
    try:
        near = cpulist.parse_list(path.read_text())
    except OSError:
        near = []
    return sorted(set(near) & set(online)) or online


def choose_irq_cpus(sys_root: Path, pci: str, explicit: list[int] | None, exclude: list[int]) -> list[int]:
    """The CPUs a device's queue IRQs go to.

    ``explicit`` None means NUMA-local.  Excluded and isolated CPUs are
    removed; when that empties the local set, the device's other online
    CPUs serve (remote but better than an isolated core), while an explicit
    list that empties is a configuration error.
    """
    online = set(online_cpus(sys_root))
    banned = set(exclude) | set(isolated_cpus(sys_root))
    if explicit is not None:
        offline = sorted(set(explicit) - online)
        if offline:
            raise TuningError(f"irqCpus names CPUs that are not online: {cpulist.format_list(offline)}")
        chosen = sorted(set(explicit) - banned)
        if not chosen:
            raise TuningError("irqCpus leaves no CPU once excluded and isolated CPUs are removed")
        return chosen
    chosen = sorted(set(local_cpus(sys_root, pci)) - banned) or sorted(online - banned)
    if not chosen:
        raise TuningError("every online CPU is excluded or isolated: no CPU left for queue IRQs")
    return chosen
