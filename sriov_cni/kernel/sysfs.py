"""What sysfs says about PFs and VFs: PCI addresses, VF indexes, drivers, netdevs.

``SYS`` and ``PROC`` are the roots every sysfs and procfs path in the package
is built from, here and in the modules that read or write their own corner
(CPUs, IRQs and queues for tuning, the VF count and driver binding in
:mod:`sriov_cni.node.vfs`); tests point them at a temporary tree that
describes PFs and VFs.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

SYS = Path("/sys")
PROC = Path("/proc")

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
    pci: str
    index: int
    pf: PF


def is_pci_address(value: str) -> bool:
    return bool(PCI_ADDRESS.fullmatch(value.lower()))


def pci_dir(pci: str) -> Path:
    return SYS / "bus" / "pci" / "devices" / pci


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


def netdevs(pci: str) -> list[str]:
    """Netdev names of a PCI function as the host network namespace sees them."""
    try:
        return sorted(os.listdir(pci_dir(pci) / "net"))
    except OSError:
        return []


def driver(pci: str) -> str | None:
    return _link_name(pci_dir(pci) / "driver")


def numvfs(pf_pci: str) -> int:
    return read_int(pci_dir(pf_pci) / "sriov_numvfs")


def totalvfs(pf_pci: str) -> int:
    return read_int(pci_dir(pf_pci) / "sriov_totalvfs")


def is_pf(pci: str) -> bool:
    return (pci_dir(pci) / "sriov_totalvfs").exists()


def vf_pcis(pf_pci: str) -> dict[int, str]:
    """Every VF of a PF by index."""
    out: dict[int, str] = {}
    # Plain strings per link: a pool of many VFs is resolved on every ADD,
    # and building a Path for each virtfn link was most of that cost.
    base = str(pci_dir(pf_pci))
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


def resolve_pf(name: str) -> PF:
    """A PF given by netdev name or PCI address."""
    if is_pci_address(name):
        pci = name.lower()
        if not pci_dir(pci).exists():
            raise SysfsError(f"no PCI device {pci}")
    else:
        pci_link = SYS / "class" / "net" / name / "device"
        target = _link_name(pci_link)
        if target is None:
            raise SysfsError(f"no network device {name!r} on this node")
        pci = target
    if not is_pf(pci):
        raise SysfsError(f"{name} is not an SR-IOV physical function (no sriov_totalvfs)")
    names = netdevs(pci)
    return PF(pci=pci, netdev=names[0] if names else None)


def resolve_vf(pci: str) -> VF:
    """A VF given by its PCI address, with its PF and index."""
    pci = pci.lower()
    if not is_pci_address(pci):
        raise SysfsError(f"{pci!r} is not a PCI address (expected DDDD:BB:DD.F)")
    if not pci_dir(pci).exists():
        raise SysfsError(f"no PCI device {pci}")
    pf_pci = _link_name(pci_dir(pci) / "physfn")
    if pf_pci is None:
        raise SysfsError(f"{pci} is not an SR-IOV virtual function (no physfn)")
    for index, candidate in vf_pcis(pf_pci).items():
        if candidate == pci:
            pf_names = netdevs(pf_pci)
            return VF(pci=pci, index=index, pf=PF(pf_pci, pf_names[0] if pf_names else None))
    raise SysfsError(f"{pci} is not listed as a VF of {pf_pci}")


def write(path: Path, value: str) -> None:
    """Write a sysfs/procfs attribute, raising the kernel's errno as SysfsError."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as exc:
        raise SysfsError(f"cannot open {path}: {exc.strerror}", exc.errno) from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise SysfsError(f"writing {value!r} to {path}: {exc.strerror}", exc.errno) from exc
    finally:
        os.close(fd)



def physfn(vf_pci: str) -> str | None:
    """The PF of a VF, from its ``physfn`` link alone (one readlink)."""
    return _link_name(pci_dir(vf_pci) / "physfn")


def netdev_link(name: str) -> tuple[int, bool]:
    """A host netdev's MTU and administrative up flag, as sysfs shows them."""
    base = SYS / "class" / "net" / name
    try:
        mtu = int((base / "mtu").read_text())
        flags = int((base / "flags").read_text(), 16)
    except (OSError, ValueError) as exc:
        raise SysfsError(f"cannot read link state of {name}: {exc}") from exc
    return mtu, bool(flags & 0x1)  # IFF_UP
