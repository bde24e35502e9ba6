"""RPS, XPS and RFS: the receive and transmit steering maps of a netdev's queues."""

from __future__ import annotations

import os
from pathlib import Path

from sriov_cni.kernel import cpulist, sysfs
from sriov_cni.kernel.irqs import Pin, Pinned


def tx_cpus(pins: list[Pin]) -> dict[int, int]:
    """Transmit queue -> CPU of its IRQ, for XPS (queues whose vector carries tx)."""
    return {p.irq.queue: p.cpu for p in pins if p.irq.kind in ("txrx", "tx", "comp") and p.result is not Pinned.FAILED}


def _queue_dirs(sys_root: Path, netdev: str, prefix: str) -> list[Path]:
    root = sys_root / "class" / "net" / netdev / "queues"
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise sysfs.SysfsError(f"{netdev}: no queues in sysfs ({exc.strerror})", exc.errno) from exc
    return sorted((root / n for n in names if n.startswith(prefix)), key=lambda p: int(p.name.split("-")[1]))


def apply_queues(
    sys_root: Path, netdev: str, rps_cpus: list[int], rfs_flow_entries: int, xps_cpus: dict[int, int] | None
) -> int:
    """Set RPS, RFS and XPS for ``netdev`` as the sysfs mounted at ``sys_root`` shows it; return the writes made.

    ``rps_cpus`` empty turns RPS off, ``rfs_flow_entries`` 0 leaves RFS
    alone, ``xps_cpus`` (transmit queue -> CPU) None leaves XPS alone.
    Run in the device's own namespace: /sys/class/net lists the netdevs of
    the namespace that mounted sysfs.  Values already in place are not
    rewritten, so re-applying the same maps writes nothing.
    """
    writes = 0
    rx = _queue_dirs(sys_root, netdev, "rx-")
    for q in rx:
        writes += _ensure_mask(q / "rps_cpus", rps_cpus)
        if rfs_flow_entries:
            per_queue = cpulist.next_pow2(max(rfs_flow_entries // len(rx), 1))
            writes += _ensure_int(q / "rps_flow_cnt", per_queue)
    if xps_cpus is not None:
        for q in _queue_dirs(sys_root, netdev, "tx-"):
            cpu = xps_cpus.get(int(q.name.split("-")[1]))
            # Single-queue devices have no xps_cpus file: nothing to steer.
            if cpu is not None and (q / "xps_cpus").exists():
                writes += _ensure_mask(q / "xps_cpus", [cpu])
    return writes


def clear_queues(sys_root: Path, netdev: str) -> None:
    """Undo :func:`apply_queues`: these maps survive moves between namespaces."""
    for q in _queue_dirs(sys_root, netdev, "rx-"):
        _ensure_mask(q / "rps_cpus", [])
        _ensure_int(q / "rps_flow_cnt", 0)
    for q in _queue_dirs(sys_root, netdev, "tx-"):
        if (q / "xps_cpus").exists():
            _ensure_mask(q / "xps_cpus", [])


def _ensure_mask(path: Path, cpus: list[int]) -> int:
    try:
        if cpulist.parse_mask(path.read_text()) == sorted(cpus):
            return 0
    except OSError as exc:
        raise sysfs.SysfsError(f"cannot read {path}: {exc.strerror}", exc.errno) from exc
    sysfs.write(path, cpulist.format_mask(cpus))
    return 1


def _ensure_int(path: Path, value: int) -> int:
    if sysfs.read_int(path) == value:
        return 0
    sysfs.write(path, str(value))
    return 1


def _sock_flow_path(proc_root: Path) -> Path:
    return proc_root / "sys" / "net" / "core" / "rps_sock_flow_entries"


def sock_flow_entries(proc_root: Path) -> int:
    """The host-wide RFS table size."""
    return sysfs.read_int(_sock_flow_path(proc_root))


def raise_sock_flow_entries(proc_root: Path, entries: int) -> str | None:
    """Make the host-wide RFS table at least ``entries`` (it exists only in the host netns).

    Never lowers it: other devices may rely on a bigger table.  Returns the
    change made, or None.
    """
    want = cpulist.next_pow2(entries)
    current = sock_flow_entries(proc_root)
    if current >= want:
        return None
    sysfs.write(_sock_flow_path(proc_root), str(want))
    return f"rps_sock_flow_entries {current} -> {want}"
