"""IRQ affinity and RPS/XPS/RFS for PFs and VFs, and the per-VF hook the plugin calls.

Node setup decides a :class:`Policy` per PF and records it in the state file
(:data:`STATE_FILE`).  A VF's queue IRQs exist only while its netdev is up,
and moving it into a pod closes it, so the plugin calls
:func:`apply_vf_tuning` after bringing the VF up in the pod and
:func:`release_vf_tuning` before taking it out again.

The plugin imports this module on every CNI call: it must stay cheap to
import (stdlib, sysfs, netlink, cpulist only) and cost one failed ``open``
when setup never wrote a policy.

IRQs are found by PCI address (``msi_irqs``), never by interface name: the
name is baked into the IRQ when the driver requests it, and every pod calls
its VF ``net1``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sriov_cni import cpulist, netlink, sysfs

STATE_FILE = Path("/run/sriov-cni/node.json")
STATE_VERSION = 1

# Queue vectors as drivers name them: igb/ixgbe/i40e/ice/iavf "<if>-TxRx-<n>",
# igb and igbvf "<if>-rx-<n>" / "<if>-tx-<n>", mlx5 "mlx5_comp<n>@pci:<bdf>".
# Misc, mailbox and async vectors ("<if>", "...:mbx", "mlx5_async@...") do
# not match and are left alone.
_QUEUE_NAME = re.compile(r"(?:^|[-_:])(?P<kind>txrx|rx|tx|comp)-?(?P<queue>\d+)(?:@.*)?$", re.IGNORECASE)
# Flow-director vectors look like queue vectors but serve no traffic queue.
_NOT_QUEUE = re.compile(r"fdir", re.IGNORECASE)

# Kernel-managed IRQs refuse user affinity: EIO before Linux 6.12, EPERM after.
_MANAGED = (errno.EIO, errno.EPERM)


class TuningError(Exception):
    pass


@dataclass(frozen=True)
class Policy:
    """What setup decided for one PF and its VFs; CPU lists are already resolved."""

    irq_cpus: list[int]
    rps_cpus: list[int]  # empty: RPS off
    rfs_flow_entries: int  # 0: RFS off
    xps: bool

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Policy:
        return cls(
            irq_cpus=[int(c) for c in raw["irq_cpus"]],
            rps_cpus=[int(c) for c in raw["rps_cpus"]],
            rfs_flow_entries=int(raw["rfs_flow_entries"]),
            xps=bool(raw["xps"]),
        )


@dataclass(frozen=True)
class QueueIrq:
    irq: int
    name: str
    kind: str  # "txrx", "rx", "tx" or "comp"
    queue: int


@dataclass(frozen=True)
class Pin:
    irq: QueueIrq
    cpu: int
    # "pinned", "unchanged", "skipped" (kernel-managed) or "failed"
    result: str
    detail: str = ""


# --- CPU choice --------------------------------------------------------------


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


# --- IRQ discovery and pinning -------------------------------------------------


def _irq_dir(irq: int) -> Path:
    return sysfs.PROC / "irq" / str(irq)


def _action_name(irq: int) -> str:
    """The name the driver gave the IRQ (last column of /proc/interrupts), "" when unrequested.

    /proc/irq/<n>/ holds one directory per action, named like that column;
    listing it avoids reading all of /proc/interrupts, which is large on
    hosts with many CPUs.
    """
    try:
        entries = list(os.scandir(_irq_dir(irq)))
    except OSError:
        return ""
    names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    return names[0] if names else ""


def device_irqs(pci: str) -> list[int]:
    """A PCI function's MSI/MSI-X IRQs that the kernel has set up (``/proc/irq/<n>`` exists)."""
    try:
        listed = os.listdir(sysfs.pci_dir(pci) / "msi_irqs")
    except OSError:
        return []
    return sorted(int(n) for n in listed if n.isdigit() and _irq_dir(int(n)).is_dir())


def classify(irq: int, name: str) -> QueueIrq | None:
    if not name or _NOT_QUEUE.search(name):
        return None
    m = _QUEUE_NAME.search(name)
    if m is None:
        return None
    return QueueIrq(irq=irq, name=name, kind=m.group("kind").lower(), queue=int(m.group("queue")))


def queue_irqs(pci: str) -> list[QueueIrq]:
    """The device's requested queue IRQs, by queue index then IRQ number."""
    found = (classify(irq, _action_name(irq)) for irq in device_irqs(pci))
    return sorted((q for q in found if q is not None), key=lambda q: (q.queue, q.irq))


def affinity(irq: int) -> list[int]:
    return cpulist.parse_list((_irq_dir(irq) / "smp_affinity_list").read_text())


def plan_pins(irqs: list[QueueIrq], cpus: list[int], start: int) -> list[tuple[QueueIrq, int]]:
    """Queue ``q`` of a device goes to ``cpus[(start + q) % len(cpus)]``.

    Keyed by queue index rather than IRQ position so that a queue's rx and
    tx vectors (igbvf has one of each) land on the same CPU.
    """
    if not irqs:
        return []
    queues = sorted({q.queue for q in irqs})
    by_queue = dict(zip(queues, cpulist.spread(cpus, start, len(queues))))
    return [(q, by_queue[q.queue]) for q in irqs]


def vf_start(vf_index: int, queues: int) -> int:
    # The PF's queues start at position 0; VF i's block follows, so
    # single-queue VFs spread over the CPUs instead of piling onto the first.
    return (vf_index + 1) * max(queues, 1)


def pin(irq: QueueIrq, cpu: int) -> Pin:
    """Pin one IRQ to one CPU, writing only when it is elsewhere, and read back."""
    path = _irq_dir(irq.irq) / "smp_affinity_list"
    try:
        if affinity(irq.irq) == [cpu]:
            return Pin(irq, cpu, "unchanged")
        sysfs.write(path, str(cpu))
        now = affinity(irq.irq)
    except sysfs.SysfsError as exc:
        if exc.errno in _MANAGED:
            return Pin(irq, cpu, "skipped", "kernel-managed IRQ, affinity not changeable")
        return Pin(irq, cpu, "failed", str(exc))
    except (OSError, cpulist.CpuListError) as exc:
        return Pin(irq, cpu, "failed", f"reading {path}: {exc}")
    if now != [cpu]:
        return Pin(irq, cpu, "failed", f"kernel kept affinity {cpulist.format_list(now)}")
    return Pin(irq, cpu, "pinned")


def pin_device(pci: str, cpus: list[int], start: int) -> list[Pin]:
    return [pin(q, cpu) for q, cpu in plan_pins(queue_irqs(pci), cpus, start)]


def default_affinity() -> list[int]:
    return cpulist.parse_mask((sysfs.PROC / "irq" / "default_smp_affinity").read_text())


# --- RPS / XPS / RFS -----------------------------------------------------------


def tx_cpus(pins: list[Pin]) -> dict[int, int]:
    """Transmit queue -> CPU of its IRQ, for XPS (queues whose vector carries tx)."""
    return {p.irq.queue: p.cpu for p in pins if p.irq.kind in ("txrx", "tx", "comp") and p.result != "failed"}


def _queue_dirs(netdev: str, prefix: str) -> list[Path]:
    root = sysfs.SYS / "class" / "net" / netdev / "queues"
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise TuningError(f"{netdev}: no queues in sysfs ({exc.strerror})") from exc
    return sorted((root / n for n in names if n.startswith(prefix)), key=lambda p: int(p.name.split("-")[1]))


def apply_queues(netdev: str, policy: Policy, xps_cpus: dict[int, int]) -> int:
    """Set RPS, RFS and XPS for ``netdev`` as the current sysfs mount shows it; return the writes made.

    Run in the device's own namespace: /sys/class/net lists the netdevs of
    the namespace that mounted sysfs.  Values already in place are not
    rewritten, so re-applying the same policy writes nothing.
    """
    writes = 0
    rx = _queue_dirs(netdev, "rx-")
    for q in rx:
        writes += _ensure_mask(q / "rps_cpus", policy.rps_cpus)
        if policy.rfs_flow_entries:
            per_queue = cpulist.next_pow2(max(policy.rfs_flow_entries // len(rx), 1))
            writes += _ensure_int(q / "rps_flow_cnt", per_queue)
    if policy.xps:
        for q in _queue_dirs(netdev, "tx-"):
            cpu = xps_cpus.get(int(q.name.split("-")[1]))
            # Single-queue devices have no xps_cpus file: nothing to steer.
            if cpu is not None and (q / "xps_cpus").exists():
                writes += _ensure_mask(q / "xps_cpus", [cpu])
    return writes


def clear_queues(netdev: str) -> None:
    """Undo :func:`apply_queues`: these maps survive moves between namespaces."""
    for q in _queue_dirs(netdev, "rx-"):
        _ensure_mask(q / "rps_cpus", [])
        _ensure_int(q / "rps_flow_cnt", 0)
    for q in _queue_dirs(netdev, "tx-"):
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


def raise_sock_flow_entries(entries: int) -> str | None:
    """Make the host-wide RFS table at least ``entries`` (it exists only in the host netns).

    Never lowers it: other devices may rely on a bigger table.  Returns the
    change made, or None.
    """
    path = sysfs.PROC / "sys" / "net" / "core" / "rps_sock_flow_entries"
    want = cpulist.next_pow2(entries)
    current = sysfs.read_int(path)
    if current >= want:
        return None
    sysfs.write(path, str(want))
    return f"rps_sock_flow_entries {current} -> {want}"


# --- state file ---------------------------------------------------------------


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file atomically, so the plugin never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": STATE_VERSION, **state}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TuningError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise TuningError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
        raise TuningError(f"{path} is not a version {STATE_VERSION} node state file; run sriov-cni setup again")
    return raw


def pf_policy(state: dict[str, Any], pf_pci: str) -> Policy | None:
    raw = state.get("pfs", {}).get(pf_pci, {}).get("tuning")
    return Policy.from_json(raw) if raw else None


def policy_json(policy: Policy) -> dict[str, Any]:
    return asdict(policy)


# --- the plugin hook -------------------------------------------------------------


def _vf_index(pf_pci: str, vf_pci: str) -> int:
    for index, pci in sysfs.vf_pcis(pf_pci).items():
        if pci == vf_pci:
            return index
    raise TuningError(f"{vf_pci} is not listed as a VF of {pf_pci}")


def apply_vf_tuning(vf_pci: str, netns: str, ifname: str) -> list[str]:
    """Apply the PF's policy to a VF that is up as ``ifname`` in ``netns``; return warnings.

    IRQ pins are written from the host (``/proc/irq`` is per host, and
    read-only in containers); RPS/XPS/RFS inside the pod's namespace with a
    private sysfs mount.  Nothing here raises: a VF that works untuned is
    better than a failed pod, so problems come back as warnings.
    """
    try:
        state = read_state(STATE_FILE)
    except TuningError as exc:
        return [str(exc)]
    if state is None:
        return []
    pf_pci = sysfs.physfn(vf_pci)
    policy = pf_policy(state, pf_pci) if pf_pci else None
    if pf_pci is None or policy is None:
        return []
    warnings: list[str] = []
    try:
        irqs = queue_irqs(vf_pci)
        if not irqs:
            warnings.append(f"VF {vf_pci} has no queue IRQs to pin (is {ifname} up?)")
        start = vf_start(_vf_index(pf_pci, vf_pci), len({q.queue for q in irqs}))
        pins = [pin(q, cpu) for q, cpu in plan_pins(irqs, policy.irq_cpus, start)]
    except (TuningError, cpulist.CpuListError) as exc:
        return warnings + [f"VF {vf_pci}: {exc}"]
    warnings += [f"VF {vf_pci} IRQ {p.irq.irq} ({p.irq.name}): {p.detail}" for p in pins if p.result == "failed"]
    if policy.rps_cpus or policy.xps:
        xps = tx_cpus(pins)

        def in_pod() -> None:
            apply_queues(ifname, policy, xps)

        try:
            netlink.run_in_netns(netns, in_pod, own_sysfs=True)
        except (netlink.NetlinkError, TuningError, sysfs.SysfsError) as exc:
            warnings.append(f"VF {vf_pci} RPS/XPS on {ifname}: {exc}")
    return warnings


def release_vf_tuning(vf_pci: str, netns: str | None = None, ifname: str | None = None) -> None:
    """Leave no tuning on a VF leaving a pod.

    Call it while the VF is still up in the pod, passing its ``netns`` and
    ``ifname``: once the VF closes (a move closes it) igbvf frees its
    vectors, and on Linux 6.1 an affinity write to a freed vector succeeds
    but is ignored, so the old pin would greet the next user.  Queue IRQs go
    back to ``/proc/irq/default_smp_affinity``; the RPS/RFS/XPS maps, which
    survive namespace moves, are cleared in the pod and on the VF's host
    netdev if it has one.  Best effort and silent: the VF is being freed,
    and a later apply overwrites whatever a failure leaves.
    """
    if not STATE_FILE.exists():
        return
    try:
        default = default_affinity()
    except (OSError, cpulist.CpuListError):
        return
    # Every vector goes back to the default: the misc one started there,
    # and a closed VF's vectors have no names to tell queue from misc.
    for irq in device_irqs(vf_pci):
        try:
            if affinity(irq) != default:
                sysfs.write(_irq_dir(irq) / "smp_affinity", cpulist.format_mask(default))
        except (OSError, sysfs.SysfsError, cpulist.CpuListError):
            continue
    if netns is not None and ifname is not None:
        pod_name = ifname

        def in_pod() -> None:
            clear_queues(pod_name)

        try:
            netlink.run_in_netns(netns, in_pod, own_sysfs=True)
        except netlink.NetlinkError:
            pass
    for name in sysfs.netdevs(vf_pci):
        try:
            clear_queues(name)
        except (TuningError, sysfs.SysfsError, cpulist.CpuListError):
            continue
