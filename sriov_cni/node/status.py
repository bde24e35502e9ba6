"""``sriov-cni status``: every SR-IOV PF on the node, its VFs, who holds them, IRQ pins and irqbalance.

And the RDMA view: the node's RDMA netns mode, and per VF its RDMA device
and where it is (``rdmaWhere``): ``host``; ``pod`` (the VF's allocation's
pod: moved there in exclusive mode, or a Soft-RoCE device made there);
``shared`` (shared mode: every namespace sees it, nothing moves); or
``elsewhere`` (exclusive mode, absent from the host, and no allocation of
ours holds it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sriov_cni import deviceinfo
from sriov_cni.kernel import cpulist, irqs, netlink, nlerrors, rdma, sysfs
from sriov_cni.node import irqbalance, rdmamode
from sriov_cni.paths import Paths
from sriov_cni.vfstate import VfState, gone, recorded_state, unrecorded_state
from sriov_cni.vfstore import Allocation, SetAside, read_set_aside, scan_allocations


def _irq_pins(paths: Paths, pci: str) -> list[dict[str, Any]]:
    out = []
    for q in irqs.queue_irqs(paths.sys, paths.proc_irq, pci):
        try:
            cpus = cpulist.format_list(irqs.affinity(paths.proc_irq, q.irq))
        except (OSError, cpulist.CpuListError):
            cpus = "?"
        out.append({"irq": q.irq, "name": q.name, "cpus": cpus})
    return out


def _link(paths: Paths, netdev: str | None) -> tuple[int | None, str]:
    if netdev is None:
        return None, "none"
    try:
        mtu, up = sysfs.netdev_link(paths.sys, netdev)
    except sysfs.SysfsError:
        return None, "?"
    return mtu, "up" if up else "down"


def _count(read: Callable[[Path, str], int], paths: Paths, pci: str) -> int | None:
    try:
        return read(paths.sys, pci)
    except sysfs.SysfsError:
        return None


@dataclass(frozen=True)
class RdmaView:
    """The host's RDMA netns mode and the RDMA devices its namespace sees; None for both without ib_core."""

    mode: str | None = None
    host_devices: frozenset[str] | None = None


def rdma_view() -> RdmaView:
    mode = rdmamode.KernelRdmaModes().get()
    if mode is None:
        return RdmaView()
    try:
        with rdma.Rdma() as host:
            return RdmaView(mode, frozenset(d.name for d in host.devices()))
    except nlerrors.NetlinkError:
        return RdmaView(mode)


def _gone(alloc: Allocation, state: VfState, proc: Path) -> str | None:
    if state is VfState.GIVING_BACK:
        return alloc.giving_back
    return gone(alloc, proc) if state is VfState.STALE else None


def _vf(
    paths: Paths,
    pf_pci: str,
    index: int,
    pci: str,
    alloc: Allocation | None,
    aside: SetAside | None,
    unreadable: str | None,
    in_host: Callable[[str], bool],
    view: RdmaView,
) -> dict[str, Any]:
    bound, netdev = sysfs.driver_and_netdev(paths.sys, pci)
    state = recorded_state(alloc, paths.proc) if alloc is not None else unrecorded_state(bound, netdev, in_host)
    if state is VfState.FREE and aside is not None:
        state = VfState.SET_ASIDE
    if unreadable is not None:
        state = VfState.UNREADABLE
    device = _rdma_device(paths, pci, alloc)
    return {
        "index": index,
        "pci": pci,
        "driver": bound,
        "netdev": netdev,
        "state": state.value,
        # Why its record cannot be read, when it cannot.
        "recordError": unreadable,
        # What an attachment's device-info file says of the VF (see deviceinfo).
        "deviceInfo": deviceinfo.facts(paths.sys, pci, pf_pci, alloc.rdma_device if alloc else None),
        "allocation": None
        if alloc is None
        else {
            "network": alloc.network,
            "containerID": alloc.container_id,
            # "namespace/name" as CNI_ARGS gave it; null when the runtime gave none.
            "pod": f"{alloc.pod_namespace}/{alloc.pod_name}" if alloc.pod_name else None,
            "podUID": alloc.pod_uid or None,
            "ifname": alloc.ifname,
            "netns": alloc.netns,
            "deviceInfoFile": alloc.device_info_file or None,
            # Why the pod is gone ("netns gone", "earlier boot") once it is.
            "gone": _gone(alloc, state, paths.proc),
            # What its last give-back could not put back: the VF is not
            # handed to another pod until one succeeds.
            "unrestored": alloc.unrestored,
        },
        # Why ADD passes over it, since when, how often, and until when
        # (see sriov_cni.plugin.aside); kept after it is taken again, until
        # it works in a pod.
        "setAside": None
        if aside is None
        else {
            "reason": aside.reason,
            "detail": aside.detail,
            "since": _when(aside.since),
            "last": _when(aside.last),
            "failures": aside.failures,
            "retryAfter": _when(aside.retry_after),
        },
        "irqs": _irq_pins(paths, pci),
        "rdmaDevice": device,
        "rdmaWhere": None if device is None else _rdma_where(device, alloc, view),
        # Its verbs character device now: a move can renumber it.
        "rdmaUverbsDevice": _uverbs(paths, pci, device),
    }


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


def _rdma_where(device: str, alloc: Allocation | None, view: RdmaView) -> str:
    held = alloc is not None and alloc.rdma_device is not None
    if held and alloc is not None and alloc.rdma_soft:
        # Made in the pod on its netdev; in shared mode every namespace
        # sees it, but it dies with the netdev's move: it is the pod's.
        return "pod"
    if view.mode == "shared":
        return "shared"
    if view.host_devices is not None and device in view.host_devices:
        return "host"
    if held:
        return "pod"
    # Without ib_core no namespace holds it; with it, exclusive mode put it
    # in a namespace that is not an attachment of ours.
    return "host" if view.host_devices is None else "elsewhere"


def _uverbs(paths: Paths, pci: str, device: str | None) -> str | None:
    if device is None or ", " in device:
        return None
    found = rdma.uverbs_device(paths.sys, pci, device)
    return None if found is None else f"/dev/infiniband/{found}"


def _rdma_device(paths: Paths, pci: str, alloc: Allocation | None) -> str | None:
    """The VF's RDMA device: the one its pod holds (moved there, or a Soft-RoCE one made there), else the VF's own.

    Its own, wherever it is: the host's sysfs lists only the devices in the
    host's namespace, ib_uverbs' entries every namespace's.
    """
    if alloc is not None and alloc.rdma_device is not None:
        return alloc.rdma_device
    found = set(rdma.vf_rdma_devices(paths.sys, pci)) | set(rdma.vf_verbs_devices(paths.sys, pci).values())
    return ", ".join(sorted(found)) if found else None


def gather(
    paths: Paths, data_dir: Path, in_host: Callable[[str], bool], view: RdmaView | None = None
) -> list[dict[str, Any]]:
    """One record per PF (anything with ``sriov_totalvfs``), VFs in index order."""
    view = RdmaView() if view is None else view
    # A damaged record is shown as such: the rest of the pool still is.
    records, unreadable = scan_allocations(data_dir)
    allocs = {a.vf_pci: a for a in records}
    aside = read_set_aside(data_dir)
    try:
        devices = sorted(os.listdir(paths.sys / "bus" / "pci" / "devices"))
    except OSError:
        devices = []
    balancers = irqbalance.running(paths.proc)
    out = []
    for pci in devices:
        if not sysfs.is_pf(paths.sys, pci):
            continue
        names = sysfs.netdevs(paths.sys, pci)
        netdev = names[0] if names else None
        mtu, link = _link(paths, netdev)
        vfs = [
            _vf(paths, pci, i, vf, allocs.get(vf), aside.get(vf), unreadable.get(vf), in_host, view)
            for i, vf in sysfs.vf_pcis(paths.sys, pci).items()
        ]
        out.append(
            {
                "pci": pci,
                "netdev": netdev,
                "driver": sysfs.driver(paths.sys, pci),
                "numVfs": _count(sysfs.numvfs, paths, pci),
                "totalVfs": _count(sysfs.totalvfs, paths, pci),
                "mtu": mtu,
                "link": link,
                "irqs": _irq_pins(paths, pci),
                # Banned only if every running irqbalance asks a policy
                # script of setup's that names this PF.
                "irqbalance": {
                    "pids": [b.pid for b in balancers],
                    "banned": bool(balancers) and all(irqbalance.protects(b, pci) for b in balancers),
                },
                "free": sum(v["state"] == VfState.FREE.value for v in vfs),
                "vfs": vfs,
            }
        )
    return out


def current(paths: Paths, data_dir: Path, view: RdmaView) -> list[dict[str, Any]]:
    """:func:`gather`, with the host's network namespace saying which VF netdevs are in it."""
    with netlink.open_namespace() as host:
        return gather(paths, data_dir, lambda name: host.find(name) is not None, view)


def _pins(irqs: list[dict[str, Any]]) -> str:
    return " ".join(f"{i['irq']}:{i['cpus']}" for i in irqs) or "-"


def _irqbalance(state: dict[str, Any]) -> str:
    if not state["pids"]:
        return "off"
    return f"on (pid {', '.join(map(str, state['pids']))}), IRQs {'banned' if state['banned'] else 'NOT banned'}"


def table(pfs: list[dict[str, Any]], rdma_mode: str | None = None) -> list[str]:
    """Human-readable lines: the RDMA netns mode (if the kernel has RDMA), then one per PF, then one per VF."""
    lines: list[str] = [] if rdma_mode is None else [f"RDMA netns mode {rdma_mode}"]
    if not pfs:
        return [*lines, "no SR-IOV PF on this node"]
    for pf in pfs:
        lines.append(
            f"PF {pf['netdev'] or '-'} {pf['pci']}  driver {pf['driver'] or '-'}  "
            f"VFs {pf['numVfs']}/{pf['totalVfs']}  MTU {pf['mtu'] or '-'}  link {pf['link']}  "
            f"free {pf['free']}  irqbalance {_irqbalance(pf['irqbalance'])}  IRQs {_pins(pf['irqs'])}"
        )
        if not pf["vfs"]:
            continue
        rows = [("VF", "PCI", "DRIVER", "NETDEV", "RDMA", "STATE", "NETWORK", "POD", "IFNAME", "IRQ:CPUS")]
        for vf in pf["vfs"]:
            a = vf["allocation"]
            # The pod by name where CNI_ARGS named it, else its container;
            # the netns path and the whole container ID are in --json.
            owner = (a["network"], a["pod"] or a["containerID"][:12], a["ifname"]) if a else ("-", "-", "-")
            state = vf["state"] + (f" ({a['gone']})" if a and a["gone"] else "")
            if vf["recordError"]:
                state += f": {vf['recordError']}"
            if a and a["unrestored"]:
                state += f" (unrestored: {'; '.join(a['unrestored'])})"
            if vf["setAside"] and vf["state"] == VfState.SET_ASIDE.value:
                aside = vf["setAside"]
                state += (
                    f" ({aside['reason']}, {aside['failures']}x since {aside['since']}, retry {aside['retryAfter']})"
                )
            rows.append(
                (
                    str(vf["index"]),
                    vf["pci"],
                    vf["driver"] or "-",
                    vf["netdev"] or "-",
                    f"{vf['rdmaDevice']}({vf['rdmaWhere']})" if vf["rdmaDevice"] else "-",
                    state,
                    *owner,
                    _pins(vf["irqs"]),
                )
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return lines
