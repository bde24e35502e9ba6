"""The per-VF tuning hook the plugin calls around a pod's VF.

Node setup records a policy per PF in the node state file
(:mod:`sriov_cni.nodestate`).
A VF's queue IRQs exist only while its netdev is up, and moving it into a
pod closes it, so the plugin calls :func:`apply_vf_tuning` after bringing
the VF up in the pod and :func:`clear_vf_tuning` before taking it out
again.

The plugin imports this module on every CNI call: it must stay cheap to
import (stdlib and the sysfs-level modules only) and cost one failed
``open`` when setup never wrote a policy.
"""

from __future__ import annotations

from sriov_cni.kernel import cpulist, sysfs
from sriov_cni.kernel.irqs import (
    Pinned,
    affinity,
    default_affinity,
    device_irqs,
    irq_dir,
    pin,
    plan_pins,
    queue_irqs,
    vf_start,
)
from sriov_cni.kernel.netns import NamespaceError, run_in_netns
from sriov_cni.kernel.queues import apply_queues, clear_queues, tx_cpus
from sriov_cni.nodestate import TuningError, pf_policy, read_state
from sriov_cni.paths import Paths


def apply_vf_tuning(paths: Paths, vf: sysfs.VF, netns: str, ifname: str) -> list[str]:
    """Apply the PF's policy in ``paths.state_file`` to a VF that is up as ``ifname`` in ``netns``; return warnings.

    ``vf`` gives its PF and index as ADD found them, so sysfs is not asked again.

    IRQ pins are written from the host (``/proc/irq`` is per host, and
    read-only in containers, hence ``paths.proc_irq``); RPS/XPS/RFS inside the pod's namespace with a
    private sysfs mount.  Nothing here raises: a VF that works untuned is
    better than a failed pod, so problems come back as warnings.
    """
    try:
        state = read_state(paths.state_file)
    except TuningError as exc:
        return [str(exc)]
    if state is None:
        return []
    policy = pf_policy(state, vf.pf.pci)
    if policy is None:
        return []
    vf_pci = vf.pci
    warnings: list[str] = []
    try:
        irqs = queue_irqs(paths.sys, paths.proc_irq, vf_pci)
        if not irqs:
            warnings.append(f"VF {vf_pci} has no queue IRQs to pin (is {ifname} up?)")
        start = vf_start(vf.index, len({q.queue for q in irqs}))
        pins = [pin(paths.proc_irq, q, cpu) for q, cpu in plan_pins(irqs, policy.irq_cpus, start)]
    except cpulist.CpuListError as exc:
        return [*warnings, f"VF {vf_pci}: {exc}"]
    warnings += [f"VF {vf_pci} IRQ {p.irq.irq} ({p.irq.name}): {p.detail}" for p in pins if p.result is Pinned.FAILED]
    if policy.rps_cpus or policy.xps:
        xps = tx_cpus(pins) if policy.xps else None

        def in_pod() -> None:
            apply_queues(paths.sys, ifname, policy.rps_cpus, policy.rfs_flow_entries, xps)

        try:
            run_in_netns(netns, in_pod, own_sysfs=paths.sys)
        except (NamespaceError, sysfs.SysfsError) as exc:
            warnings.append(f"VF {vf_pci} RPS/XPS on {ifname}: {exc}")
    return warnings


def clear_vf_tuning(paths: Paths, vf_pci: str, netns: str | None = None, ifname: str | None = None) -> None:
    """Leave no tuning on a VF leaving a pod (none to leave when setup wrote no ``paths.state_file``).

    Call it while the VF is still up in the pod, passing its ``netns`` and
    ``ifname``: once the VF closes (a move closes it) igbvf frees its
    vectors, and on Linux 6.1 an affinity write to a freed vector succeeds
    but is ignored, so the old pin would greet the next user.  Queue IRQs go
    back to ``/proc/irq/default_smp_affinity``; the RPS/RFS/XPS maps, which
    survive namespace moves, are cleared in the pod and on the VF's host
    netdev if it has one.  Best effort and silent: the VF is being freed,
    and a later apply overwrites whatever a failure leaves.
    """
    if not paths.state_file.exists():
        return
    try:
        default = default_affinity(paths.proc_irq)
    except (OSError, cpulist.CpuListError):
        return
    # Every vector goes back to the default: the misc one started there,
    # and a closed VF's vectors have no names to tell queue from misc.
    for irq in device_irqs(paths.sys, paths.proc_irq, vf_pci):
        try:
            if affinity(paths.proc_irq, irq) != default:
                sysfs.write(irq_dir(paths.proc_irq, irq) / "smp_affinity", cpulist.format_mask(default))
        except (OSError, sysfs.SysfsError, cpulist.CpuListError):
            continue
    if netns is not None and ifname is not None:
        pod_name = ifname

        def in_pod() -> None:
            clear_queues(paths.sys, pod_name)

        try:
            run_in_netns(netns, in_pod, own_sysfs=paths.sys)
        except NamespaceError:
            pass
    for name in sysfs.netdevs(paths.sys, vf_pci):
        try:
            clear_queues(paths.sys, name)
        except (sysfs.SysfsError, cpulist.CpuListError):
            continue
