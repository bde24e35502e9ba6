"""``sriov-cni setup``: turn a node config into steps, and run or print them.

Planning reads sysfs and the plugin's store only; every change happens in a
step's ``run``, so ``--dry-run`` prints the same plan that a real run
executes.  A step with nothing to do is reported as unchanged and has no
``run``, which is what makes a second run write nothing.
"""

from __future__ import annotations

import errno
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sriov_cni import nodestate
from sriov_cni.kernel import cpulist, firstopen, irqs, netlink, nlerrors, queues, sysfs
from sriov_cni.kernel.vfsettings import ZERO_MAC
from sriov_cni.node import cpus, irqbalance, rdmamode, vfs
from sriov_cni.node.config import NodeConfig, PfSpec, TuningSpec
from sriov_cni.nodestate import Policy, TuningError
from sriov_cni.paths import Paths
from sriov_cni.vfstore import Allocation, read_allocations


class SetupError(Exception):
    pass


class Links(Protocol):
    """The link changes setup makes on PFs and new VFs (netlink on a real node)."""

    def set_up(self, netdev: str) -> None: ...

    def set_mtu(self, netdev: str, mtu: int) -> None: ...

    def open_vf_once(self, pf: str, vf: int, netdev: str) -> None: ...

    def vf_macs(self, pf: str) -> dict[int, str]:
        """The PF's reading of each VF's MAC (the admin MAC, or zero), by VF index."""
        ...

    def set_vf_mac(self, pf: str, vf: int, mac: str) -> None: ...


class NetlinkLinks:
    def _index(self, ns: netlink.Namespace, netdev: str) -> int:
        link = ns.find(netdev)
        if link is None:
            raise SetupError(f"{netdev}: no such network device")
        return link.index

    def set_up(self, netdev: str) -> None:
        with netlink.open_namespace() as ns:
            ns.set_up(self._index(ns, netdev), True)

    def set_mtu(self, netdev: str, mtu: int) -> None:
        with netlink.open_namespace() as ns:
            ns.set_mtu(self._index(ns, netdev), mtu)

    def open_vf_once(self, pf: str, vf: int, netdev: str) -> None:
        try:
            firstopen.open_once(pf, vf, netdev)
        except firstopen.FirstOpenError as exc:
            raise SetupError(str(exc)) from exc

    def vf_macs(self, pf: str) -> dict[int, str]:
        vfc = netlink.KernelVfControl()
        try:
            return {index: info.mac or ZERO_MAC for index, info in vfc.vfs(pf).items()}
        except nlerrors.NetlinkError as exc:
            raise SetupError(f"{pf}: reading its VFs' MACs: {exc}") from exc
        finally:
            vfc.close()

    def set_vf_mac(self, pf: str, vf: int, mac: str) -> None:
        vfc = netlink.KernelVfControl()
        try:
            vfc.set_mac(pf, vf, mac)
        except nlerrors.NetlinkError as exc:
            raise SetupError(f"{pf}: setting VF {vf}'s admin MAC {mac}: {exc}") from exc
        finally:
            vfc.close()


@dataclass
class Step:
    target: str  # which PF, as "eth0 (0000:01:00.0)"
    what: str
    run: Callable[[], str] | None = None  # None: already as asked
    # Extra lines for --dry-run, computed only then: reading every IRQ's
    # name is the slowest part of planning.
    details: Callable[[], list[str]] = lambda: []
    # For a step that can take seconds: the line said before it runs, so
    # that a run waiting on a driver does not look hung.
    announce: str | None = None


@dataclass
class Plan:
    steps: list[Step]
    state: dict[str, Any]  # what the state file will say after the run
    tuned: list[sysfs.PF]  # PFs with a tuning policy, whose IRQs irqbalance must leave alone
    irqbalance: str  # the node config's irqbalance mode
    # What the run could not make so now, and when it will be: the node is
    # not yet as asked (setup's exit status says so).
    deferred: list[str] = field(default_factory=list)


def _policy(paths: Paths, pf: sysfs.PF, spec: TuningSpec) -> Policy:
    irq_cpus = cpus.choose_irq_cpus(paths.sys, pf.pci, spec.irq_cpus, spec.exclude_cpus)
    rps_cpus: list[int] = []
    if spec.rps:
        # The kernel rejects an RPS mask of isolated CPUs only (EINVAL).
        rps_cpus = sorted(set(spec.rps_cpus or irq_cpus) - set(cpus.isolated_cpus(paths.sys)))
        if not rps_cpus:
            raise TuningError("rpsCpus leaves no CPU once isolated CPUs are removed")
    return Policy(irq_cpus=irq_cpus, rps_cpus=rps_cpus, rfs_flow_entries=spec.rfs_flow_entries, xps=spec.xps)


def _describe(policy: Policy) -> str:
    parts = [f"queue IRQs round robin over CPUs {cpulist.format_list(policy.irq_cpus)}"]
    if policy.rps_cpus:
        parts.append(f"RPS on {cpulist.format_list(policy.rps_cpus)}")
    if policy.rfs_flow_entries:
        parts.append(f"RFS {policy.rfs_flow_entries} flows")
    if policy.xps:
        parts.append("XPS")
    return ", ".join(parts)


def _run_tuning(paths: Paths, pf: sysfs.PF, policy: Policy, pinned: dict[str, int]) -> str:
    pins = irqs.pin_device(paths.sys, paths.proc_irq, pf.pci, policy.irq_cpus, 0)
    failed = [p for p in pins if p.result is irqs.Pinned.FAILED]
    if failed:
        p = failed[0]
        raise SetupError(f"{pf.netdev}: pinning IRQ {p.irq.irq} ({p.irq.name}) to CPU {p.cpu}: {p.detail}")
    pinned.update({str(p.irq.irq): p.cpu for p in pins if p.result is not irqs.Pinned.SKIPPED})
    if not pins:
        return "no queue IRQs found (nothing to pin)"
    done = (irqs.Pinned.PINNED, irqs.Pinned.UNCHANGED, irqs.Pinned.SKIPPED)
    counts = {r: sum(p.result is r for p in pins) for r in done}
    summary = ", ".join(f"{n} IRQs {r.value}" for r, n in counts.items() if n)
    if counts[irqs.Pinned.SKIPPED]:
        summary += " (kernel-managed IRQs refuse user affinity)"
    if pf.netdev and (policy.rps_cpus or policy.xps):
        try:
            xps = queues.tx_cpus(pins) if policy.xps else None
            writes = queues.apply_queues(paths.sys, pf.netdev, policy.rps_cpus, policy.rfs_flow_entries, xps)
        except sysfs.SysfsError as exc:
            raise SetupError(f"{pf.netdev}: RPS/XPS: {exc}") from exc
        summary += f", queue maps {'unchanged' if not writes else f'{writes} written'}"
    return summary


def _driver_step(
    paths: Paths, target: str, spec: PfSpec, pf: sysfs.PF, allocations: list[Allocation], fresh: bool
) -> Step | None:
    """Put the PF's VFs on ``spec.vf_driver``; ``kernel`` takes DPDK-bound VFs back to their own driver.

    Allocated VFs are left alone: a pod is using them as they are.  With
    ``kernel`` the step shows only when there is something to rebind.
    """
    driver = None if spec.vf_driver == "kernel" else spec.vf_driver
    taken = {a.vf_pci for a in allocations}

    def misplaced() -> list[str]:
        out = []
        for vf in sysfs.vf_pcis(paths.sys, pf.pci).values():
            current = sysfs.driver(paths.sys, vf)
            wrong = current in sysfs.DPDK_DRIVERS if driver is None else current != driver
            if wrong and vf not in taken:
                out.append(vf)
        return out

    def rebind() -> str:
        try:
            n = sum(vfs.bind(paths.sys, vf, driver) for vf in misplaced())
        except vfs.VfError as exc:
            raise SetupError(str(exc)) from exc
        return f"{n} VFs rebound"

    # Freshly created VFs come up on the kernel driver, so only a DPDK
    # driver has work to do after a count change.
    if not spec.num_vfs:
        return None
    pending = (fresh and driver is not None) or (not fresh and bool(misplaced()))
    if driver is None and not pending:
        return None
    where_to = "their kernel driver" if driver is None else driver
    return Step(
        target,
        f"VFs on {spec.vf_driver}",
        rebind if pending else None,
        announce=f"{pf.netdev or spec.pf}: binding its VFs to {where_to} (each probe may take a second)",
    )


def _check_pf(paths: Paths, where: str, spec: PfSpec, pf: sysfs.PF) -> None:
    if sysfs.driver(paths.sys, pf.pci) is None:
        raise SetupError(f"{where}.pf: {spec.pf} has no driver bound: {vfs.explain(errno.ENOENT)}")
    total = sysfs.totalvfs(paths.sys, pf.pci)
    if spec.num_vfs > total:
        raise SetupError(f"{where}.numVfs: {spec.num_vfs} is more than {spec.pf} supports (sriov_totalvfs {total})")


def _numvfs_step(
    paths: Paths, target: str, spec: PfSpec, pf: sysfs.PF, allocations: list[Allocation], current: int
) -> Step:
    if current == spec.num_vfs:
        return Step(target, f"sriov_numvfs {current}")
    owners = [a for a in allocations if a.pf_pci == pf.pci]
    if current and owners:
        who = "; ".join(f"VF {a.vf_index} ({a.network}, container {a.container_id}, {a.ifname})" for a in owners)
        raise SetupError(
            f"refusing to change {spec.pf} from {current} to {spec.num_vfs} VFs: the change goes through 0 "
            f"and would destroy allocated VFs: {who}"
        )
    return Step(
        target,
        f"sriov_numvfs {current} -> {spec.num_vfs}",
        functools.partial(_create_vfs, paths, spec, pf),
        announce=_numvfs_announce(paths, spec, pf, current),
    )


# PF drivers known to take long over an sriov_numvfs write: mlx5 sets up
# each VF's firmware resources there (up to two minutes for many VFs).
_SLOW_NUMVFS = {"mlx5_core": "mlx5 may take up to two minutes"}


def _numvfs_announce(paths: Paths, spec: PfSpec, pf: sysfs.PF, current: int) -> str:
    name = pf.netdev or spec.pf
    if not current:
        what = f"creating {spec.num_vfs} VFs"
    elif not spec.num_vfs:
        what = f"removing its {current} VFs"
    else:
        what = f"changing from {current} to {spec.num_vfs} VFs, through 0"
    slow = _SLOW_NUMVFS.get(sysfs.driver(paths.sys, pf.pci) or "")
    if slow is None:
        wait = f"waiting up to {vfs.WRITE_TIMEOUT:.0f} s for the driver"
    else:
        wait = slow + (" for each write" if current and spec.num_vfs else "")
    return f"{name}: {what} ({wait})"


def _create_vfs(paths: Paths, spec: PfSpec, pf: sysfs.PF) -> str:
    try:
        enabled = vfs.set_numvfs(paths.sys, pf.pci, spec.num_vfs, spec.vf_driver == "kernel")
    except vfs.VfError as exc:
        raise SetupError(str(exc)) from exc
    if enabled != spec.num_vfs:
        raise SetupError(f"{spec.pf}: asked for {spec.num_vfs} VFs, the driver enabled {enabled}")
    return "done"


def _link_steps(paths: Paths, where: str, target: str, spec: PfSpec, pf: sysfs.PF, links: Links) -> list[Step]:
    """The PF netdev's MTU raised to the config's, and its link up."""
    if pf.netdev is None:
        if spec.mtu is not None or spec.tuning is not None:
            raise SetupError(f"{where}: {spec.pf} has no netdev, so mtu and tuning cannot apply")
        return []
    steps: list[Step] = []
    mtu, up = sysfs.netdev_link(paths.sys, pf.netdev)
    if spec.mtu is not None:
        if mtu >= spec.mtu:
            steps.append(Step(target, f"MTU {mtu} (>= {spec.mtu})"))
        else:
            raise_mtu = functools.partial(_raise_mtu, links, pf.netdev, spec.mtu)
            steps.append(Step(target, f"MTU {mtu} -> {spec.mtu}", raise_mtu))
    if up:
        steps.append(Step(target, "link up"))
    else:
        steps.append(Step(target, "link down -> up", functools.partial(_bring_up, links, pf.netdev)))
    return steps


def _raise_mtu(links: Links, netdev: str, mtu: int) -> str:
    links.set_mtu(netdev, mtu)
    return "done"


def _bring_up(links: Links, netdev: str) -> str:
    links.set_up(netdev)
    return "done"


def _first_open_step(paths: Paths, target: str, spec: PfSpec, pf: sysfs.PF, links: Links) -> Step | None:
    """New VFs on their kernel driver opened and closed once, after the PF link is up (see firstopen)."""
    if pf.netdev is None or spec.vf_driver != "kernel" or not spec.num_vfs:
        return None
    pf_netdev = pf.netdev

    def run() -> str:
        opened = 0
        for index, vf in sorted(sysfs.vf_pcis(paths.sys, pf.pci).items()):
            names = sysfs.netdevs(paths.sys, vf)
            if names and sysfs.driver(paths.sys, vf) not in sysfs.DPDK_DRIVERS:
                links.open_vf_once(pf_netdev, index, names[0])
                opened += 1
        return f"{opened} VFs"

    return Step(target, "new VFs opened and closed once", run)


def admin_mac(pf_mac: str, index: int) -> str:
    """VF ``index``'s admin MAC, from its PF's: locally administered unicast, the same at every run.

    Hashed rather than counted up from the PF's MAC: a NIC's PFs have
    consecutive MACs, and PF 0's VF 1 would take PF 1's VF 0's.
    """
    digest = hashlib.sha256(f"{pf_mac.lower()}#{index}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def _admin_mac_step(
    paths: Paths, target: str, spec: PfSpec, pf: sysfs.PF, allocations: list[Allocation], links: Links
) -> Step | None:
    """Each VF without an admin MAC given one, then its driver rebound, so that the driver reads it at probe.

    mlx5 makes a VF's node GUID from the admin MAC it finds when the VF's
    driver binds; a VF created without one has node GUID 0, and rdma_cm
    cannot use it (ib_write_bw -R fails in librdmacm).  An admin MAC set
    before (by an earlier run, or the operator) is kept; an allocated VF is
    left to its pod.
    """
    if not spec.admin_macs or not spec.num_vfs or pf.netdev is None:
        return None
    pf_netdev = pf.netdev
    try:
        pf_mac = (paths.sys / "class" / "net" / pf_netdev / "address").read_text().strip()
    except OSError as exc:
        raise SetupError(f"{pf_netdev}: reading its MAC: {exc.strerror or exc}") from exc
    taken = {a.vf_pci for a in allocations}

    def wanting() -> dict[int, str]:
        vfs_now = sysfs.vf_pcis(paths.sys, pf.pci)
        macs = links.vf_macs(pf_netdev)
        return {i: vf for i, vf in vfs_now.items() if macs.get(i, ZERO_MAC) == ZERO_MAC and vf not in taken}

    def run() -> str:
        done = 0
        for index, vf in sorted(wanting().items()):
            links.set_vf_mac(pf_netdev, index, admin_mac(pf_mac, index))
            try:
                vfs.rebind(paths.sys, vf)
            except vfs.VfError as exc:
                raise SetupError(str(exc)) from exc
            done += 1
        return f"{done} VFs given an admin MAC and rebound"

    # New VFs have none yet; existing ones are read now.
    fresh = sysfs.numvfs(paths.sys, pf.pci) != spec.num_vfs
    if not fresh and not wanting():
        return Step(target, "every VF has an admin MAC")
    return Step(target, "VFs without an admin MAC given one, then rebound", run)


def _tuning_step(
    paths: Paths, where: str, target: str, tuning: TuningSpec, pf: sysfs.PF, pinned: dict[str, int]
) -> tuple[Step, Policy]:
    """Pin the PF's queue IRQs (and set its queue maps) by the policy decided now; the pins go into ``pinned``."""
    try:
        policy = _policy(paths, pf, tuning)
    except TuningError as exc:
        raise SetupError(f"{where}.tuning: {exc}") from exc
    run = functools.partial(_run_tuning, paths, pf, policy, pinned)
    return Step(target, _describe(policy), run, functools.partial(_planned_pins, paths, pf, policy)), policy


def _planned_pins(paths: Paths, pf: sysfs.PF, policy: Policy) -> list[str]:
    # Pins as the IRQs are now; a VF count change or link up re-requests
    # them, and the run pins whatever exists at that point.
    return [
        f"IRQ {q.irq} ({q.name}) -> CPU {cpu}"
        for q, cpu in irqs.plan_pins(irqs.queue_irqs(paths.sys, paths.proc_irq, pf.pci), policy.irq_cpus, 0)
    ]


def _pf_steps(
    paths: Paths, index: int, spec: PfSpec, pf: sysfs.PF, allocations: list[Allocation], links: Links
) -> tuple[list[Step], dict[str, Any]]:
    """The steps for one ``pfs`` entry, and what the state file will record of it."""
    where = f"pfs[{index}]"
    target = f"{pf.netdev or spec.pf} ({pf.pci})"
    _check_pf(paths, where, spec, pf)
    current = sysfs.numvfs(paths.sys, pf.pci)
    steps = [_numvfs_step(paths, target, spec, pf, allocations, current)]
    driver_step = _driver_step(paths, target, spec, pf, allocations, fresh=current != spec.num_vfs)
    if driver_step is not None:
        steps.append(driver_step)
    steps += _link_steps(paths, where, target, spec, pf, links)
    admin = _admin_mac_step(paths, target, spec, pf, allocations, links)
    if admin is not None:
        steps.append(admin)
    first_open = _first_open_step(paths, target, spec, pf, links) if current != spec.num_vfs else None
    if first_open is not None:
        steps.append(first_open)
    record: dict[str, Any] = {
        "netdev": pf.netdev,
        "numVfs": spec.num_vfs,
        "vfDriver": spec.vf_driver,
        "tuning": None,
        "pins": {},
    }
    if spec.tuning is not None:
        step, policy = _tuning_step(paths, where, target, spec.tuning, pf, record["pins"])
        steps.append(step)
        record["tuning"] = nodestate.policy_json(policy)
    return steps, record


def _rdma_steps(mode: str, paths: Paths, modes: rdmamode.RdmaModes, deferred: list[str]) -> list[Step]:
    """The ib_core boot option for ``mode``, then the running kernel switched when it lets setup."""
    path = rdmamode.option_path(paths.modprobe_dir)
    what = f"RDMA netns mode {mode} at boot ({path})"
    if rdmamode.boot_option_ok(paths.modprobe_dir, mode):
        steps = [Step("host", what)]
    else:
        steps = [Step("host", what, functools.partial(_boot_option, paths.modprobe_dir, mode))]
    current = modes.get()
    if current is None:
        # Nothing to switch: ib_core reads the option when it loads.
        steps.append(Step("host", f"RDMA netns mode {mode} when ib_core loads (not loaded now)"))
    elif current == mode:
        steps.append(Step("host", f"RDMA netns mode {mode}"))
    else:
        switch = functools.partial(_switch_rdma_mode, modes, current, mode, deferred)
        steps.append(Step("host", f"RDMA netns mode {current} -> {mode}", switch))
    return steps


def _boot_option(modprobe_dir: Path, mode: str) -> str:
    try:
        return rdmamode.write_boot_option(modprobe_dir, mode)
    except OSError as exc:
        raise SetupError(f"RDMA netns mode: {exc.strerror or exc}: {exc.filename}") from exc


def _switch_rdma_mode(modes: rdmamode.RdmaModes, current: str, mode: str, deferred: list[str]) -> str:
    try:
        modes.set(mode)
    except nlerrors.Busy:
        # Not an error: a node with pods has their namespaces; the boot
        # option written above applies at the next boot.
        note = (
            f"the running kernel stays {current}: other network namespaces exist (pods), and the kernel "
            f"switches only while none does; {mode} applies at the next boot (or ib_core reload)"
        )
        deferred.append(f"RDMA netns mode: {note}")
        return f"deferred: {note}"
    except nlerrors.NetlinkError as exc:
        raise SetupError(f"RDMA netns mode {current} -> {mode}: {exc}") from exc
    return "done"


def plan(
    config: NodeConfig,
    paths: Paths,
    data_dir: Path,
    links: Links,
    modes: rdmamode.RdmaModes | None = None,
) -> Plan:
    """The steps for ``config``; ``modes`` is the running kernel's RDMA netns mode (the kernel's if None)."""
    allocations = read_allocations(data_dir)
    steps: list[Step] = []
    pfs: dict[str, Any] = {}
    tuned: list[sysfs.PF] = []
    rfs = 0
    for index, spec in enumerate(config.pfs):
        try:
            pf = sysfs.resolve_pf(paths.sys, spec.pf)
        except sysfs.SysfsError as exc:
            raise SetupError(f"pfs[{index}].pf: {exc}") from exc
        if pf.pci in pfs:
            raise SetupError(f"pfs[{index}].pf: {spec.pf} is {pf.pci}, which an earlier entry already configures")
        pf_steps, record = _pf_steps(paths, index, spec, pf, allocations, links)
        steps += pf_steps
        pfs[pf.pci] = record
        if spec.tuning is not None:
            tuned.append(pf)
            rfs = max(rfs, spec.tuning.rfs_flow_entries)
    if rfs:
        # One table for the whole host, sized for the biggest request.
        want = cpulist.next_pow2(rfs)
        current = queues.sock_flow_entries(paths.proc)
        if current >= want:
            steps.append(Step("host", f"rps_sock_flow_entries {current} (>= {want})"))
        else:
            raise_entries = functools.partial(_flow_entries, paths, rfs)
            steps.append(Step("host", f"rps_sock_flow_entries {current} -> {want}", raise_entries))
    result = Plan(steps=steps, state={"pfs": pfs}, tuned=tuned, irqbalance=config.irqbalance)
    if config.rdma_netns_mode is not None:
        modes = rdmamode.KernelRdmaModes() if modes is None else modes
        result.steps += _rdma_steps(config.rdma_netns_mode, paths, modes, result.deferred)
    return result


def _flow_entries(paths: Paths, entries: int) -> str:
    try:
        queues.raise_sock_flow_entries(paths.proc, entries)
    except sysfs.SysfsError as exc:
        raise SetupError(f"rps_sock_flow_entries: {exc}") from exc
    return "done"


def _irqbalance(plan_: Plan, paths: Paths, announce: Callable[[str], None]) -> list[str]:
    """Ban or stop irqbalance before anything is pinned, so that it cannot move a fresh pin back."""
    try:
        if plan_.irqbalance == "ban":
            script = irqbalance.policy_script(paths.state_file)
            return irqbalance.ban(paths.proc, script, [pf.pci for pf in plan_.tuned], announce)
        if plan_.irqbalance == "stop":
            return irqbalance.stop(paths.proc, paths.systemd_run, announce)
    except OSError as exc:
        raise SetupError(f"irqbalance: {exc.strerror or exc}") from exc
    return []


def _quiet(line: str) -> None:
    pass


def execute(plan_: Plan, paths: Paths, echo: Callable[[str], None], announce: Callable[[str], None] = _quiet) -> bool:
    """Run every step, one progress line each, then record what was applied in ``paths.state_file``.

    ``announce`` gets one line before each step that can take seconds
    (sriov_numvfs, VF rebinds, waiting on irqbalance); ``echo`` gets each
    step's outcome.  False when the node is not yet as asked
    (``plan_.deferred`` says what and when).
    """
    state_file = paths.state_file
    for line in _irqbalance(plan_, paths, announce):
        echo(line)
    for step in plan_.steps:
        if step.run is not None and step.announce is not None:
            announce(step.announce)
        result = step.run() if step.run is not None else "unchanged"
        echo(f"{step.target}: {step.what}: {result}")
    try:
        old = nodestate.read_state(state_file)
    except TuningError:
        old = None
    new = {"version": nodestate.STATE_VERSION, **plan_.state}
    if old == new:
        echo(f"state {state_file}: unchanged")
    else:
        try:
            nodestate.write_state(state_file, plan_.state)
        except OSError as exc:
            raise SetupError(f"cannot write {state_file}: {exc.strerror or exc}") from exc
        echo(f"state {state_file}: written")
    running = irqbalance.pids(paths.proc) if plan_.tuned and plan_.irqbalance == "leave" else []
    if running:
        irqs = sorted(int(irq) for record in plan_.state["pfs"].values() for irq in record["pins"])
        echo(f"warning: {irqbalance.advice(running, irqs)}")
    for note in plan_.deferred:
        echo(f"not yet as asked: {note}")
    return not plan_.deferred


def show(plan_: Plan, paths: Paths, echo: Callable[[str], None]) -> None:
    """The plan for ``--dry-run``: what each step would do, changing nothing."""
    echo("dry run: nothing is changed")
    running = irqbalance.pids(paths.proc)
    if plan_.irqbalance == "ban" and plan_.tuned:
        which = ", ".join(pf.pci for pf in plan_.tuned)
        echo(f"irqbalance: policy script bans the IRQs of {which} and their VFs: would write if changed")
    elif plan_.irqbalance == "stop":
        echo(f"irqbalance: stop: {'would stop pid ' + ', '.join(map(str, running)) if running else 'unchanged'}")
    for step in plan_.steps:
        echo(f"{step.target}: {step.what}: {'would change' if step.run is not None else 'unchanged'}")
        for line in step.details():
            echo(f"  {line}")
    if plan_.irqbalance == "leave" and plan_.tuned and running:
        echo("warning: irqbalance is running and would undo the IRQ pins (see setup --help)")
