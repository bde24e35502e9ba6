"""Creating VFs through ``sriov_numvfs`` and binding them to their driver.

The kernel refuses to change a non-zero VF count directly (EBUSY), so a
change goes through 0.  Its errors are terse errnos; :func:`explain` turns
them into what the operator has to do.  Drivers may enable fewer VFs than
asked with only a kernel log warning, so the count is read back.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

from sriov_cni.kernel import sysfs

# Some drivers block in the sriov_numvfs write (i40e "other operation is
# pending"); the write runs in a thread so a stuck driver becomes an error
# instead of a hung boot.
WRITE_TIMEOUT = 120.0
# How long VFs may take to show up with their netdevs after the write.
APPEAR_TIMEOUT = 60.0
_POLL = 0.02

_EXPLAIN = {
    errno.ERANGE: "more VFs than the device supports (see sriov_totalvfs)",
    errno.EBUSY: "VFs are already present; the count has to go through 0 first",
    errno.ENOSPC: "no MSI-X interrupt vectors left for the VFs (too many vectors used by the PF and other drivers)",
    errno.ENOMEM: "no room for the VFs' PCI resources: SR-IOV is disabled in the firmware/BIOS, "
    "or boot with pci=realloc",
    errno.ENOENT: "the PF has no driver, or its driver cannot create VFs through sysfs",
}


class VfError(Exception):
    pass


def explain(code: int) -> str:
    return _EXPLAIN.get(code, os.strerror(code))


def _numvfs_path(sys_root: Path, pf_pci: str) -> Path:
    return sysfs.pci_dir(sys_root, pf_pci) / "sriov_numvfs"


def _write_count(sys_root: Path, pf_pci: str, count: int, timeout: float) -> None:
    failure: list[sysfs.SysfsError] = []

    def write() -> None:
        try:
            sysfs.write(_numvfs_path(sys_root, pf_pci), str(count))
        except sysfs.SysfsError as exc:
            failure.append(exc)

    worker = threading.Thread(target=write, name=f"sriov_numvfs {pf_pci}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise VfError(
            f"{pf_pci}: writing {count} to sriov_numvfs did not return within {timeout:.0f} s; the PF driver is stuck"
        )
    if failure:
        raise VfError(f"{pf_pci}: cannot set sriov_numvfs to {count}: {explain(failure[0].errno)}")


def _present(sys_root: Path, pf_pci: str, count: int, want_netdevs: bool) -> bool:
    vfs = sysfs.vf_pcis(sys_root, pf_pci)
    if len(vfs) < count:
        return False
    for index in range(count):
        vf = vfs.get(index)
        if vf is None or not (sysfs.pci_dir(sys_root, vf) / "physfn").exists():
            return False
        if want_netdevs and not sysfs.netdevs(sys_root, vf):
            return False
    return True


def wait_for_vfs(sys_root: Path, pf_pci: str, count: int, want_netdevs: bool, timeout: float = APPEAR_TIMEOUT) -> None:
    """Wait until VFs 0..count-1 exist (and, for kernel drivers, have their netdevs)."""
    deadline = time.monotonic() + timeout
    while not _present(sys_root, pf_pci, count, want_netdevs):
        if time.monotonic() >= deadline:
            missing = [
                f"VF {i}"
                for i, vf in sysfs.vf_pcis(sys_root, pf_pci).items()
                if i < count and not sysfs.netdevs(sys_root, vf)
            ]
            what = f" ({', '.join(missing)} without netdev; is the VF driver loaded?)" if missing else ""
            raise VfError(f"{pf_pci}: {count} VFs did not appear within {timeout:.0f} s{what}")
        time.sleep(_POLL)


def set_numvfs(sys_root: Path, pf_pci: str, count: int, want_netdevs: bool, timeout: float = WRITE_TIMEOUT) -> int:
    """Set the VF count (through 0 when VFs exist) and return what the driver enabled."""
    if sysfs.numvfs(sys_root, pf_pci) != 0:
        _write_count(sys_root, pf_pci, 0, timeout)
    if count:
        _write_count(sys_root, pf_pci, count, timeout)
    enabled = sysfs.numvfs(sys_root, pf_pci)
    if enabled:
        wait_for_vfs(sys_root, pf_pci, enabled, want_netdevs)
    return enabled


def _on(current: str | None, driver: str | None) -> bool:
    """Whether a VF on ``current`` is where :func:`bind` with ``driver`` puts it."""
    if driver is None:
        return current is not None and current not in sysfs.DPDK_DRIVERS
    return current == driver


def bind(sys_root: Path, vf_pci: str, driver: str | None) -> bool:
    """Bind a VF to ``driver``, or with None to the kernel's own driver for it; False when it already was.

    driver_override makes the probe pick exactly ``driver`` (a DPDK driver
    claims no device by ID); it is cleared afterwards so that a later rebind
    to the kernel driver is not blocked.
    """
    current = sysfs.driver(sys_root, vf_pci)
    # A VF on no driver, asked for none in particular, is left unbound.
    if current == driver or _on(current, driver):
        return False
    if driver is not None:
        if not (sys_root / "bus" / "pci" / "drivers" / driver).is_dir():
            raise VfError(f"{driver} driver is not loaded (modprobe {driver})")
        if driver == "vfio-pci" and not (sysfs.pci_dir(sys_root, vf_pci) / "iommu_group").exists():
            raise VfError(
                f"{vf_pci} has no IOMMU group: enable VT-d/AMD-Vi in the BIOS and boot with intel_iommu=on iommu=pt"
            )
    override = sysfs.pci_dir(sys_root, vf_pci) / "driver_override"
    try:
        if current is not None:
            sysfs.write(sys_root / "bus" / "pci" / "drivers" / current / "unbind", vf_pci)
        if driver is not None:
            sysfs.write(override, driver)
        sysfs.write(sys_root / "bus" / "pci" / "drivers_probe", vf_pci)
        sysfs.write(override, "\n")
    except sysfs.SysfsError as exc:
        raise VfError(f"binding {vf_pci} to {driver or 'its kernel driver'}: {exc}") from exc
    after = sysfs.driver(sys_root, vf_pci)
    if not _on(after, driver):
        raise VfError(f"{vf_pci} is on {after or 'no driver'} after binding to {driver or 'its kernel driver'}")
    return True


def rebind(sys_root: Path, vf_pci: str) -> None:
    """Unbind the VF from its driver and probe it again, so the driver starts it anew (as at creation)."""
    current = sysfs.driver(sys_root, vf_pci)
    if current is None:
        return
    try:
        sysfs.write(sys_root / "bus" / "pci" / "drivers" / current / "unbind", vf_pci)
        sysfs.write(sys_root / "bus" / "pci" / "drivers_probe", vf_pci)
    except sysfs.SysfsError as exc:
        raise VfError(f"rebinding {vf_pci} to {current}: {exc}") from exc
    if sysfs.driver(sys_root, vf_pci) != current:
        raise VfError(f"{vf_pci} is on {sysfs.driver(sys_root, vf_pci) or 'no driver'} after rebinding to {current}")
