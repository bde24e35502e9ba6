"""What sysfs says about PFs and VFs: PCI addresses, VF indexes, drivers, netdevs.

Every function that reads the node takes sysfs' mount point ``root`` first
(``/sys`` on a node; the entry points carry it down), as the IRQ and queue
modules take theirs: no root is a module global, so a test
describes PFs and VFs in a temporary tree and passes its root.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")

# VFs bound to these drivers serve DPDK pods: they have no netdev to move.
DPDK_DRIVERS = frozenset({"vfio-pci", "uio_pci_generic", "igb_uio"})

_VIRTFN = re.compile(r"virtfn([0-9]+)")


class SysfsError(Exception):
    """A device is missing or sysfs refused a read or write; ``errno`` is the kernel's answer."""

    def __init__(self, msg: str, code: int | None = errno.EIO) -> None:
        super().__init__(msg)
        self.errno = code if code is not None else errno.EIO


@dataclass(frozen=True)
class PF:
    pci: str
    netdev: str | None


@dataclass(frozen=True)
class VF:
    """Where a VF sits: its PCI address, its PF and its index there."""

    pci: str
    index: int
    pf: PF


@dataclass(frozen=True)
class VfDevice(VF):
    """A VF with what sysfs said of it at one reading (:func:`describe`): its driver and its host netdev.

    ``netdev`` is None on a DPDK driver, which gives a VF none, and for a VF
    whose netdev is not in the host network namespace (a pod has it) or
    that has no driver.
    """

    driver: str | None
    netdev: str | None

    @property
    def dpdk(self) -> bool:
        return self.driver in DPDK_DRIVERS


def is_pci_address(value: str) -> bool:
    return bool(PCI_ADDRESS.fullmatch(value.lower()))


def pci_dir(root: Path, pci: str) -> Path:
    return root / "bus" / "pci" / "devices" / pci


def _link_name(path: Path | str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise SysfsError(f"cannot read {path}: {exc}") from exc


def netdevs(root: Path, pci: str) -> list[str]:
    """Netdev names of a PCI function as the host network namespace sees them."""
    try:
        return sorted(os.listdir(pci_dir(root, pci) / "net"))
    except OSError:
        return []


def driver(root: Path, pci: str) -> str | None:
    return _link_name(pci_dir(root, pci) / "driver")


def driver_and_netdev(root: Path, pci: str) -> tuple[str | None, str | None]:
    """A PCI function's driver and its netdev in the host network namespace (none is looked for on a DPDK driver)."""
    bound = driver(root, pci)
    names = [] if bound in DPDK_DRIVERS else netdevs(root, pci)
    return bound, names[0] if names else None


def describe(root: Path, vf: VF) -> VfDevice:
    """``vf`` with its driver and host netdev, as sysfs shows them now."""
    return VfDevice(vf.pci, vf.index, vf.pf, *driver_and_netdev(root, vf.pci))


def numvfs(root: Path, pf_pci: str) -> int:
    return read_int(pci_dir(root, pf_pci) / "sriov_numvfs")


def totalvfs(root: Path, pf_pci: str) -> int:
    return read_int(pci_dir(root, pf_pci) / "sriov_totalvfs")


def is_pf(root: Path, pci: str) -> bool:
    return (pci_dir(root, pci) / "sriov_totalvfs").exists()


def vf_pcis(root: Path, pf_pci: str) -> dict[int, str]:
    """Every VF of a PF by index."""
    out: dict[int, str] = {}
    # Plain strings per link: a pool of many VFs is resolved on every ADD,
    # and building a Path for each virtfn link was most of that cost.
    base = str(pci_dir(root, pf_pci))
    try:
        entries = os.listdir(base)
    except OSError:
        return out
    for entry in entries:
        m = _VIRTFN.fullmatch(entry)
        if m:
            target = _link_name(f"{base}/{entry}")
            if target:
                out[int(m.group(1))] = target
    return dict(sorted(out.items()))


def resolve_pf(root: Path, name: str) -> PF:
    """A PF given by netdev name or PCI address."""
    if is_pci_address(name):
        pci = name.lower()
        if not pci_dir(root, pci).exists():
            raise SysfsError(f"no PCI device {pci}")
    else:
        pci_link = root / "class" / "net" / name / "device"
        target = _link_name(pci_link)
        if target is None:
            raise SysfsError(f"no network device {name!r} on this node")
        pci = target
    if not is_pf(root, pci):
        raise SysfsError(f"{name} is not an SR-IOV physical function (no sriov_totalvfs)")
    names = netdevs(root, pci)
    return PF(pci=pci, netdev=names[0] if names else None)


def resolve_vf(root: Path, pci: str) -> VF:
    """A VF given by its PCI address, with its PF and index."""
    pci = pci.lower()
    if not is_pci_address(pci):
        raise SysfsError(f"{pci!r} is not a PCI address (expected DDDD:BB:DD.F)")
    if not pci_dir(root, pci).exists():
        raise SysfsError(f"no PCI device {pci}")
    pf_pci = _link_name(pci_dir(root, pci) / "physfn")
    if pf_pci is None:
        raise SysfsError(f"{pci} is not an SR-IOV virtual function (no physfn)")
    for index, candidate in vf_pcis(root, pf_pci).items():
        if candidate == pci:
            pf_names = netdevs(root, pf_pci)
            return VF(pci=pci, index=index, pf=PF(pf_pci, pf_names[0] if pf_names else None))
    raise SysfsError(f"{pci} is not listed as a VF of {pf_pci}")


def write(path: Path, value: str) -> None:
    """Write a sysfs/procfs attribute, raising the kernel's errno as SysfsError.

    Opened truncating, as ``echo V > attr`` opens it: sysfs and procfs
    ignore the truncation (a write replaces the value), and a plain file
    standing in for the attribute ends holding just ``value`` too.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as exc:
        raise SysfsError(f"cannot open {path}: {exc.strerror}", exc.errno) from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise SysfsError(f"writing {value!r} to {path}: {exc.strerror}", exc.errno) from exc
    finally:
        os.close(fd)


def netdev_link(root: Path, name: str) -> tuple[int, bool]:
    """A host netdev's MTU and administrative up flag, as sysfs shows them."""
    base = root / "class" / "net" / name
    try:
        mtu = int((base / "mtu").read_text())
        flags = int((base / "flags").read_text(), 16)
    except (OSError, ValueError) as exc:
        raise SysfsError(f"cannot read link state of {name}: {exc}") from exc
    return mtu, bool(flags & 0x1)  # IFF_UP


def carrier_ups(root: Path, name: str) -> int | None:
    """How often host netdev ``name`` gained carrier since its driver registered it; None when sysfs does not say."""
    try:
        return int((root / "class" / "net" / name / "carrier_up_count").read_text())
    except (OSError, ValueError):
        return None


def carrier(root: Path, name: str) -> bool | None:
    """Whether host netdev ``name`` has carrier; None when sysfs does not say (a netdev that is down, or none)."""
    try:
        return (root / "class" / "net" / name / "carrier").read_text().strip() == "1"
    except OSError:
        # The kernel answers EINVAL for a netdev that is down.
        return None
