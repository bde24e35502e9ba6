"""Per-attachment traffic series, read at each scrape from the VF records: which pod sends what through which VF.

One series set per record of the store (an attachment: a VF in a pod's
network namespace), labelled ``namespace``, ``pod``, ``interface``,
``network``, ``pf`` and ``vf`` (the VF's PCI address, as
``sriov_cni_vf_set_aside_failures`` has it).  A record without the pod's
name (a runtime that gave no ``K8S_POD_*`` in CNI_ARGS: podman, ctr) shows
its container ID's first 12 characters as ``pod``, as ``sriov-cni status``
does, and an empty ``namespace``.  The series are made from the records at
each scrape, so an attachment's go with its DEL.

The VF's counters are its PF's (rtnetlink's IFLA_VF_STATS): read from the
host, no namespace entered, one request per PF whatever the number of its
VFs (:class:`~sriov_cni.kernel.vfcontrol.KernelVfStats`), each holding RTNL
only while the kernel fills that PF's answer.  An attachment with an RDMA
device also has its ports' counters: read in the pod's namespace in
exclusive mode (a forked child per device, see
:func:`~sriov_cni.kernel.rdmacounters.read_in_netns`), in the host's in
shared mode.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UnknownMetricFamily

from sriov_cni.kernel import netns, nlerrors, rdmacounters
from sriov_cni.kernel.vfsettings import VfStatsReader
from sriov_cni.vfstore import Allocation, scan_allocations

LABELS = ["namespace", "pod", "interface", "network", "pf", "vf"]
RDMA_LABELS = [*LABELS, "device", "port"]
# The VF counters by VfStats field: (metric name without _total, help).
VF_COUNTERS = {
    "rx_bytes": ("sriov_cni_pod_vf_receive_bytes", "Bytes the pod's VF received, as its PF counts them"),
    "tx_bytes": ("sriov_cni_pod_vf_transmit_bytes", "Bytes the pod's VF sent, as its PF counts them"),
    "rx_packets": ("sriov_cni_pod_vf_receive_packets", "Packets the pod's VF received, as its PF counts them"),
    "tx_packets": ("sriov_cni_pod_vf_transmit_packets", "Packets the pod's VF sent, as its PF counts them"),
    "broadcast": ("sriov_cni_pod_vf_receive_broadcast_packets", "Broadcast packets the pod's VF received"),
    "multicast": ("sriov_cni_pod_vf_receive_multicast_packets", "Multicast packets the pod's VF received"),
    "rx_dropped": ("sriov_cni_pod_vf_receive_dropped_packets", "Packets for the pod's VF its PF dropped"),
    "tx_dropped": ("sriov_cni_pod_vf_transmit_dropped_packets", "Packets from the pod's VF its PF dropped"),
}
# The InfiniBand PMA counters given a name of their own, in bytes or packets:
# (counter file, multiplier, metric name without _total, help).  The data
# counters count 4-byte words.
RDMA_NAMED = (
    ("port_xmit_data", 4, "sriov_cni_pod_rdma_transmit_bytes", "Bytes the pod's RDMA port sent (port_xmit_data x 4)"),
    ("port_rcv_data", 4, "sriov_cni_pod_rdma_receive_bytes", "Bytes the pod's RDMA port received (port_rcv_data x 4)"),
    ("port_xmit_packets", 1, "sriov_cni_pod_rdma_transmit_packets", "Packets the pod's RDMA port sent"),
    ("port_rcv_packets", 1, "sriov_cni_pod_rdma_receive_packets", "Packets the pod's RDMA port received"),
)


def labels_of(alloc: Allocation) -> list[str]:
    """The attachment's label values, in :data:`LABELS` order."""
    pod = alloc.pod_name or alloc.container_id[:12]
    namespace = alloc.pod_namespace if alloc.pod_name else ""
    return [namespace, pod, alloc.ifname, alloc.network, alloc.pf_netdev, alloc.vf_pci]


@dataclass(frozen=True)
class Sources:
    """Where the attachments' counters come from: replaced by fakes in tests."""

    vf_stats: Callable[[], VfStatsReader]
    # The node's RDMA netns mode, asked only when a record has an RDMA device.
    rdma_mode: Callable[[], str | None]
    # An RDMA device's counters: in the host's sysfs (sys_root, device), and
    # in a pod's namespace (netns path, sys_root, device).
    rdma_in_host: Callable[[Path, str], list[rdmacounters.PortCounter]] = rdmacounters.read
    rdma_in_pod: Callable[[str, Path, str], list[rdmacounters.PortCounter]] = rdmacounters.read_in_netns


def attachments(sys_root: Path, data_dir: Path, sources: Sources) -> Iterator[Metric]:
    """The series of every attachment recorded under ``data_dir``, read now."""
    records, _ = scan_allocations(data_dir)
    records.sort(key=lambda a: (a.pf_netdev, a.vf_index))
    readable = GaugeMetricFamily(
        "sriov_cni_pf_vf_stats_up", "Whether the PF's VF counters could be read for this scrape", labels=["pf"]
    )
    families = {field: CounterMetricFamily(name, text, labels=LABELS) for field, (name, text) in VF_COUNTERS.items()}
    by_pf: dict[str, list[Allocation]] = {}
    for alloc in records:
        by_pf.setdefault(alloc.pf_netdev, []).append(alloc)
    reader = sources.vf_stats()
    try:
        for pf, allocs in by_pf.items():
            try:
                stats = reader.vf_stats(pf)
            except (nlerrors.NetlinkError, OSError) as exc:
                sys.stderr.write(f"sriov-cni daemon: metrics: cannot read the VF counters of {pf}: {exc}\n")
                readable.add_metric([pf], 0)
                continue
            readable.add_metric([pf], 1)
            for alloc in allocs:
                vf = stats.get(alloc.vf_index)
                if vf is None:
                    continue  # the PF has no such VF now (sriov_numvfs changed)
                values = labels_of(alloc)
                for field, family in families.items():
                    family.add_metric(values, getattr(vf, field))
    finally:
        reader.close()
    yield readable
    yield from families.values()
    yield from _rdma(sys_root, [a for a in records if a.rdma_device], sources)


def _rdma(sys_root: Path, records: list[Allocation], sources: Sources) -> Iterator[Metric]:
    named = {
        counter: (scale, CounterMetricFamily(name, text, labels=RDMA_LABELS))
        for counter, scale, name, text in RDMA_NAMED
    }
    raw = UnknownMetricFamily(
        "sriov_cni_pod_rdma_port_counter",
        "Every counter of the pod's RDMA port as sysfs shows it, by directory (counters, hw_counters) and file; "
        "port_xmit_data and port_rcv_data in 4-byte words",
        labels=[*RDMA_LABELS, "group", "counter"],
    )
    mode = sources.rdma_mode() if records else None
    for alloc in records:
        assert alloc.rdma_device is not None
        try:
            if mode == "exclusive":
                counters = sources.rdma_in_pod(alloc.netns, sys_root, alloc.rdma_device)
            else:
                counters = sources.rdma_in_host(sys_root, alloc.rdma_device)
        except (netns.NamespaceError, OSError) as exc:
            # The pod's namespace is gone (a stale record) or cannot be entered.
            sys.stderr.write(f"sriov-cni daemon: metrics: cannot read {alloc.rdma_device}'s counters: {exc}\n")
            continue
        for c in counters:
            values = [*labels_of(alloc), alloc.rdma_device, str(c.port)]
            raw.add_metric([*values, c.group, c.name], c.value)
            if c.group == "counters" and c.name in named:
                scale, family = named[c.name]
                family.add_metric(values, c.value * scale)
    yield from (family for _, family in named.values())
    yield raw
