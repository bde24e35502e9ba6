"""Which CPUs a PF's queue IRQs go to: NUMA-local, minus excluded and isolated CPUs."""

from __future__ import annotations

from sriov_cni.kernel import cpulist, sysfs
from sriov_cni.nodestate import TuningError


def _cpu_file(name: str) -> list[int]:
    try:
        text = (sysfs.SYS / "devices" / "system" / "cpu" / name).read_text().strip()
    except OSError:
        return []
    # Kernels built with NO_HZ_FULL but booted without nohz_full= print
    # "(null)" in the nohz_full file rather than an empty list.
    if text == "(null)":
        return []
    return cpulist.parse_list(text)


def online_cpus() -> list[int]:
    return _cpu_file("online")


def isolated_cpus() -> list[int]:
    """CPUs the kernel keeps free of housekeeping: ``isolcpus=`` and ``nohz_full=``."""
    return sorted(set(_cpu_file("isolated")) | set(_cpu_file("nohz_full")))


def numa_node(pci: str) -> int:
    try:
        return sysfs.read_int(sysfs.pci_dir(pci) / "numa_node")
    except sysfs.SysfsError:
        return -1


def local_cpus(pci: str) -> list[int]:
    """CPUs nearest the device: its NUMA node's, else ``local_cpulist``, else every online CPU."""
    online = online_cpus()
    node = numa_node(pci)
    path = (
        sysfs.SYS / "devices" / "system" / "node" / f"node{node}" / "cpulist"
        if node >= 0
        else sysfs.pci_dir(pci) / "local_cpulist"
    )
    try:
        near = cpulist.parse_list(path.read_text())
    except OSError:
        near = []
    return sorted(set(near) & set(online)) or online


def choose_irq_cpus(pci: str, explicit: list[int] | None, exclude: list[int]) -> list[int]:
    """The CPUs a device's queue IRQs go to.

    ``explicit`` None means NUMA-local.  Excluded and isolated CPUs are
    removed; when that empties the local set, the device's other online
    CPUs serve (remote but better than an isolated core), while an explicit
    list that empties is a configuration error.
    """
    online = set(online_cpus())
    banned = set(exclude) | set(isolated_cpus())
    if explicit is not None:
        offline = sorted(set(explicit) - online)
        if offline:
            raise TuningError(f"irqCpus names CPUs that are not online: {cpulist.format_list(offline)}")
        chosen = sorted(set(explicit) - banned)
        if not chosen:
            raise TuningError("irqCpus leaves no CPU once excluded and isolated CPUs are removed")
        return chosen
    chosen = sorted(set(local_cpus(pci)) - banned) or sorted(online - banned)
    if not chosen:
        raise TuningError("every online CPU is excluded or isolated: no CPU left for queue IRQs")
    return chosen
