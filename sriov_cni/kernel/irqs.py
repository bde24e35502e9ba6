"""Queue IRQs of a PCI function: finding them and pinning each to one CPU.

IRQs are found by PCI address (``msi_irqs``), never by interface name: the
name is baked into the IRQ when the driver requests it, and every pod calls
its VF ``net1``.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from sriov_cni.kernel import cpulist, sysfs

# Queue vectors as drivers name them: igb/ixgbe/i40e/ice/iavf "<if>-TxRx-<n>",
# igb and igbvf "<if>-rx-<n>" / "<if>-tx-<n>", mlx5 "mlx5_comp<n>@pci:<bdf>".
# Misc, mailbox and async vectors ("<if>", "...:mbx", "mlx5_async@...") do
# not match and are left alone.
_QUEUE_NAME = re.compile(r"(?:^|[-_:])(?P<kind>txrx|rx|tx|comp)-?(?P<queue>\d+)(?:@.*)?$", re.IGNORECASE)
# Flow-director vectors look like queue vectors but serve no traffic queue.
_NOT_QUEUE = re.compile(r"fdir", re.IGNORECASE)
# Kernel-managed IRQs refuse user affinity: EIO before Linux 6.12, EPERM after.
_MANAGED = (errno.EIO, errno.EPERM)


@dataclass(frozen=True)
class QueueIrq:
    irq: int
    name: str
    kind: str  # "txrx", "rx", "tx" or "comp"
    queue: int


class Pinned(Enum):
    """What pinning an IRQ did; the value is how setup's summary says it."""

    PINNED = "pinned"
    UNCHANGED = "unchanged"
    # A kernel-managed IRQ: it refuses user affinity.
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Pin:
    irq: QueueIrq
    cpu: int
    result: Pinned
    detail: str = ""


# ``irq_root`` below is where the host's /proc/irq is reached: not always
# there, since a container that is not privileged gets /proc/irq read-only
# from its runtime and reaches a writable mount of it elsewhere
# (``sriov-cni daemon --proc-irq``).  ``sys_root`` is sysfs' mount point.


def irq_dir(irq_root: Path, irq: int) -> Path:
    return irq_root / str(irq)


def _action_name(irq_root: Path, irq: int) -> str:
    """The name the driver gave the IRQ (last column of /proc/interrupts), "" when unrequested.

    /proc/irq/<n>/ holds one directory per action, named like that column;
    listing it avoids reading all of /proc/interrupts, which is large on
    hosts with many CPUs.
    """
    try:
        entries = list(os.scandir(irq_dir(irq_root, irq)))
    except OSError:
        return ""
    names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    return names[0] if names else ""


def device_irqs(sys_root: Path, irq_root: Path, pci: str) -> list[int]:
    """A PCI function's MSI/MSI-X IRQs that the kernel has set up (``/proc/irq/<n>`` exists)."""
    try:
        listed = os.listdir(sysfs.pci_dir(sys_root, pci) / "msi_irqs")
    except OSError:
        return []
    return sorted(int(n) for n in listed if n.isdigit() and irq_dir(irq_root, int(n)).is_dir())


def classify(irq: int, name: str) -> QueueIrq | None:
    if not name or _NOT_QUEUE.search(name):
        return None
    m = _QUEUE_NAME.search(name)
    if m is None:
        return None
    return QueueIrq(irq=irq, name=name, kind=m.group("kind").lower(), queue=int(m.group("queue")))


def queue_irqs(sys_root: Path, irq_root: Path, pci: str) -> list[QueueIrq]:
    """The device's requested queue IRQs, by queue index then IRQ number."""
    found = (classify(irq, _action_name(irq_root, irq)) for irq in device_irqs(sys_root, irq_root, pci))
    return sorted((q for q in found if q is not None), key=lambda q: (q.queue, q.irq))


def affinity(irq_root: Path, irq: int) -> list[int]:
    return cpulist.parse_list((irq_dir(irq_root, irq) / "smp_affinity_list").read_text())


def plan_pins(irqs: list[QueueIrq], cpus: list[int], start: int) -> list[tuple[QueueIrq, int]]:
    """Queue ``q`` of a device goes to ``cpus[(start + q) % len(cpus)]``.

    Keyed by queue index rather than IRQ position so that a queue's rx and
    tx vectors (igbvf has one of each) land on the same CPU.
    """
    if not irqs:
        return []
    queues = sorted({q.queue for q in irqs})
    by_queue = dict(zip(queues, cpulist.spread(cpus, start, len(queues)), strict=True))
    return [(q, by_queue[q.queue]) for q in irqs]


def vf_start(vf_index: int, queues: int) -> int:
    # The PF's queues start at position 0; VF i's block follows, so
    # single-queue VFs spread over the CPUs instead of piling onto the first.
    return (vf_index + 1) * max(queues, 1)


def pin(irq_root: Path, irq: QueueIrq, cpu: int) -> Pin:
    """Pin one IRQ to one CPU, writing only when it is elsewhere, and read back."""
    path = irq_dir(irq_root, irq.irq) / "smp_affinity_list"
    try:
        if affinity(irq_root, irq.irq) == [cpu]:
            return Pin(irq, cpu, Pinned.UNCHANGED)
        sysfs.write(path, str(cpu))
        now = affinity(irq_root, irq.irq)
    except sysfs.SysfsError as exc:
        if exc.errno in _MANAGED:
            return Pin(irq, cpu, Pinned.SKIPPED, "kernel-managed IRQ, affinity not changeable")
        return Pin(irq, cpu, Pinned.FAILED, str(exc))
    except (OSError, cpulist.CpuListError) as exc:
        return Pin(irq, cpu, Pinned.FAILED, f"reading {path}: {exc}")
    if now != [cpu]:
        return Pin(irq, cpu, Pinned.FAILED, f"kernel kept affinity {cpulist.format_list(now)}")
    return Pin(irq, cpu, Pinned.PINNED)


def pin_device(sys_root: Path, irq_root: Path, pci: str, cpus: list[int], start: int) -> list[Pin]:
    return [pin(irq_root, q, cpu) for q, cpu in plan_pins(queue_irqs(sys_root, irq_root, pci), cpus, start)]


def default_affinity(irq_root: Path) -> list[int]:
    return cpulist.parse_mask((irq_root / "default_smp_affinity").read_text())
