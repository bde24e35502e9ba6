"""Prometheus metrics of the daemon (``--metrics-address``): a :class:`Metrics` its server owns.

Counting calls.  Every call runs in a forked child of the daemon that serves
up to ``--calls-per-child`` calls in turn and may be SIGKILLed at any point
(by its watchdog when its caller hangs up, or by the OOM killer, which
takes children first).  So the child counts nothing itself: after
answering, it reports the call on its channel (:mod:`child`), and the
daemon's loop tells :class:`Metrics` of each event of a call's life: a
child forked, a call handed to it (so the call's executable and CNI command
are known, and which child holds it), the call reported, the child ended,
a request refused before any child saw it.  A child that ends without
having reported its call is counted there, as what its caller got, code 11
"ended without an answer".  prometheus_client's multiprocess mode, the
other pattern for forked workers, fits neither half: each child would write
its own files into a shared directory, kept after it ends so that its
counts survive, so a daemon with ``--calls-per-child 1`` would leave one
set per call for every scrape to read; and a child killed during its call
writes nothing, so the call its caller saw fail would not be counted at
all.

Serving is the exporter's (:mod:`exporter`), a process of its own that asks
the daemon's loop for :meth:`Metrics.exposition` at each scrape, and reads
the node's series itself then, which are defined here too: the pool per
PF (:func:`pool`, what ``sriov-cni status --json`` shows) and each
attachment's traffic (:func:`attachments`).

Per-attachment traffic series: which pod sends what through which VF.

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
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import prometheus_client
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from sriov_cni import __version__, wire
from sriov_cni.cni import Code
from sriov_cni.daemon.child import Reported
from sriov_cni.kernel import netns, nlerrors, rdmacounters, sysfs
from sriov_cni.kernel.vfsettings import VfStatsReader
from sriov_cni.node import status
from sriov_cni.paths import Paths
from sriov_cni.vfstate import VfState
from sriov_cni.vfstore import Allocation, scan_allocations

# Commands a call may name; anything else a caller sends in CNI_COMMAND is
# counted as "other", so a caller cannot create series at will.
COMMANDS = frozenset({"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"})
# What the shim and the Python client answer when the call's child ended
# without an answer (shim/sriov-shim.c, client.py).
ENDED_WITHOUT_ANSWER = str(int(Code.TRY_AGAIN))


def command_label(command: str) -> str:
    return command if command in COMMANDS else "other"


@dataclass
class _InFlight:
    program: str
    command: str
    since: float


class Metrics:
    """The daemon's counters, in a registry of their own, fed by the events of its loop."""

    def __init__(self) -> None:
        # A series per created counter and histogram, "_created", would double
        # the exposition and says nothing here: the daemon's start is in
        # process_start_time_seconds.  prometheus_client keeps this switch for
        # the whole process; the daemon is its only user there.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry = CollectorRegistry()
        # The daemon's process_* and python_* series, as the default registry has them.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
        self._calls = Counter(
            "sriov_cni_calls",
            "CNI calls served, by executable, CNI command and result: the CNI error code the caller got, 0 for success",
            ["program", "command", "result"],
            registry=registry,
        )
        self._duration = Histogram(
            "sriov_cni_call_duration_seconds",
            "Seconds from a child taking a call to its answer, by executable and CNI command",
            ["program", "command"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self._claims_refused = Counter(
            "sriov_cni_vf_claims_refused",
            "VF claims an ADD found held by another call, and passed the VF over",
            registry=registry,
        )
        self._refused = Counter(
            "sriov_cni_requests_refused",
            "Requests the daemon answered itself, running nothing (another version, a malformed, stalled or "
            "unknown request, a caller not root, too many at once), by CNI error code",
            ["result"],
            registry=registry,
        )
        self._forked = Counter(
            "sriov_cni_daemon_children_forked", "Children the daemon forked to serve calls", registry=registry
        )
        self._ended = Counter(
            "sriov_cni_daemon_children_ended",
            "Children that ended: at_start (before they could take a call), "
            "in_call (killed while running one), after_calls (their calls done, or idle)",
            ["how"],
            registry=registry,
        )
        self._restarts = Counter(
            "sriov_cni_daemon_exporter_restarts",
            "Metrics exporters the daemon started again after one ended (each a gap in the scrapes)",
            registry=registry,
        )
        self._given_back = Counter(
            "sriov_cni_vfs_given_back",
            "VFs of pods that died without a DEL, given back by the daemon, by why the pod was gone "
            "(netns gone, earlier boot) and result (given_back, failed: the VF keeps part of its pod)",
            ["reason", "result"],
            registry=registry,
        )
        Info("sriov_cni_build", "The daemon's version", registry=registry).info({"version": __version__})
        # Children running a call: handed one, and not yet reported on.
        self._in_flight: dict[int, _InFlight] = {}

    def watch(self, children: _Children, calls: _Intake) -> None:
        """Report the state of the daemon's ``children`` and ``calls`` at each scrape."""
        self.registry.register(_Health(children, calls, self._in_flight))

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)

    def forked(self) -> None:
        self._forked.inc()

    def handed(self, pid: int, body: bytes) -> None:
        """The daemon handed child ``pid`` the call whose request is ``body``."""
        # Only what the labels need: decoding a 1 MiB environment here would
        # stall the daemon's loop for every caller (see wire.decode_head).
        _, program, _ = wire.decode_head(body)
        command = command_label(wire.env_value(body, "CNI_COMMAND") or "")
        self._in_flight[pid] = _InFlight(program, command, time.monotonic())

    def reported(self, pid: int, report: Reported) -> None:
        """Child ``pid`` reported the call it was handed."""
        call = self._in_flight.pop(pid, None)
        if call is None:
            return  # not handed a call: nothing to report on
        self._count(call, report.result, report.seconds)
        self._claims_refused.inc(report.claims_refused)

    def ended(self, pid: int, starting: bool) -> None:
        """Child ``pid`` ended (its reports read first): a call it did not report on is counted."""
        call = self._in_flight.pop(pid, None)
        if call is not None:
            self._count(call, ENDED_WITHOUT_ANSWER, time.monotonic() - call.since)
            self._ended.labels("in_call").inc()
        else:
            self._ended.labels("at_start" if starting else "after_calls").inc()

    def refused(self, code: int) -> None:
        """The daemon answered a request itself, with ``code``, and ran nothing."""
        self._refused.labels(str(code)).inc()

    def given_back(self, reason: str, result: str) -> None:
        """The healing process gave a dead pod's VF back (or failed to)."""
        self._given_back.labels(reason, result).inc()

    def exporter_restarted(self) -> None:
        self._restarts.inc()

    def _count(self, call: _InFlight, result: str, seconds: float) -> None:
        self._calls.labels(call.program, call.command, result).inc()
        self._duration.labels(call.program, call.command).observe(seconds)


class _Children(Protocol):
    @property
    def max(self) -> int: ...
    @property
    def starting(self) -> Sized: ...
    @property
    def waiting(self) -> Sized: ...


class _Intake(Protocol):
    @property
    def reading(self) -> Sized: ...
    @property
    def ready(self) -> Sized: ...


class _Health(Collector):
    """The daemon's children and queue, read at each scrape."""

    def __init__(self, children: _Children, calls: _Intake, in_flight: Sized) -> None:
        self._children = children
        self._calls = calls
        self._in_flight = in_flight

    def collect(self) -> Iterable[Metric]:
        states = GaugeMetricFamily(
            "sriov_cni_daemon_children",
            "The daemon's children: starting, waiting for a call, running one",
            labels=["state"],
        )
        states.add_metric(["starting"], len(self._children.starting))
        states.add_metric(["waiting"], len(self._children.waiting))
        states.add_metric(["running"], len(self._in_flight))
        yield states
        yield GaugeMetricFamily(
            "sriov_cni_daemon_children_max",
            "Calls the daemon runs at once at most (--max-children, lowered to fit its memory)",
            value=self._children.max,
        )
        yield GaugeMetricFamily(
            "sriov_cni_daemon_calls_queued",
            "Complete requests waiting for a child (more wait in the socket's listen queue)",
            value=len(self._calls.ready),
        )
        yield GaugeMetricFamily(
            "sriov_cni_daemon_requests_reading", "Requests the daemon is reading", value=len(self._calls.reading)
        )


# --- the node's series, read by the exporter at each scrape ----------------------


def pool(paths: Paths, data_dir: Path) -> Iterator[Metric]:
    """The pool per PF, as ``sriov-cni status --json`` shows it now."""
    readable = GaugeMetricFamily("sriov_cni_pool_up", "Whether the pool could be read for this scrape")
    try:
        view = status.rdma_view()
        pfs = status.current(paths, data_dir, view)
        rdma_mode = view.mode
    except Exception as exc:  # a scrape shows the failure; the exporter serves the next one
        sys.stderr.write(f"sriov-cni daemon: metrics: cannot read the VF pool: {exc}\n")
        readable.add_metric([], 0)
        yield readable
        return
    readable.add_metric([], 1)
    yield readable
    pf_labels = ["pf", "pci"]
    numvfs = GaugeMetricFamily("sriov_cni_pf_vfs", "VFs the PF has (sriov_numvfs)", labels=pf_labels)
    totalvfs = GaugeMetricFamily("sriov_cni_pf_vfs_max", "VFs the PF can have (sriov_totalvfs)", labels=pf_labels)
    states = GaugeMetricFamily(
        "sriov_cni_vfs",
        "The PF's VFs by state: free, allocated, stale (its pod's "
        "network namespace is gone), giving back (the daemon is giving a stale one back), "
        "in use (not ours, or without a driver), "
        "set aside (free, but it did not come up in a pod)",
        labels=[*pf_labels, "state"],
    )
    dpdk = GaugeMetricFamily("sriov_cni_vfs_dpdk", "The PF's VFs bound to a DPDK driver", labels=pf_labels)
    allocations = GaugeMetricFamily(
        "sriov_cni_allocations", "The PF's allocated and stale VFs by network", labels=[*pf_labels, "network", "state"]
    )
    # One series per mode, 1 for the running one (none without ib_core).
    rdma_modes = GaugeMetricFamily(
        "sriov_cni_rdma_netns_mode", "The node's RDMA netns mode (1: the running one)", labels=["mode"]
    )
    if rdma_mode is not None:
        for mode in ("exclusive", "shared"):
            rdma_modes.add_metric([mode], int(mode == rdma_mode))
    rdma_devices = GaugeMetricFamily(
        "sriov_cni_rdma_devices",
        "The RDMA devices of the PF's VFs by where they are: host, pod (an attachment's), shared "
        "(shared mode: every namespace sees them), elsewhere (a namespace no attachment of ours has)",
        labels=[*pf_labels, "where"],
    )
    set_aside = GaugeMetricFamily(
        "sriov_cni_vf_set_aside_failures",
        "VFs set aside because they did not come up in a pod (see status): failures in a row, by reason",
        labels=[*pf_labels, "vf", "reason"],
    )
    for pf in pfs:
        labels = [pf["netdev"] or "", pf["pci"]]
        for vf in pf["vfs"]:
            if vf["setAside"] is not None:
                set_aside.add_metric([*labels, vf["pci"], vf["setAside"]["reason"]], vf["setAside"]["failures"])
        if pf["numVfs"] is not None:
            numvfs.add_metric(labels, pf["numVfs"])
        if pf["totalVfs"] is not None:
            totalvfs.add_metric(labels, pf["totalVfs"])
        by_state = {state.value: 0 for state in VfState}
        by_network: dict[tuple[str, str], int] = {}
        for vf in pf["vfs"]:
            by_state[vf["state"]] += 1
            if vf["allocation"] is not None:
                key = (vf["allocation"]["network"], vf["state"])
                by_network[key] = by_network.get(key, 0) + 1
        for state, count in by_state.items():
            states.add_metric([*labels, state], count)
        dpdk.add_metric(labels, sum(vf["driver"] in sysfs.DPDK_DRIVERS for vf in pf["vfs"]))
        for (network, state), count in sorted(by_network.items()):
            allocations.add_metric([*labels, network, state], count)
        wheres = [vf["rdmaWhere"] for vf in pf["vfs"] if vf["rdmaWhere"] is not None]
        for where in sorted(set(wheres)):
            rdma_devices.add_metric([*labels, where], wheres.count(where))
    yield from (numvfs, totalvfs, states, dpdk, allocations, rdma_modes, rdma_devices, set_aside)


def attachments_or_none(paths: Paths, data_dir: Path, sources: Sources) -> Iterator[Metric]:
    """The per-attachment series (:func:`attachments`); none for a scrape that cannot read the records."""
    try:
        # Read whole before the first is yielded: a failure shows no half set.
        found = list(attachments(paths.sys, data_dir, sources))
    except Exception as exc:  # a scrape shows the pool's failure (sriov_cni_pool_up); this one serves the rest
        sys.stderr.write(f"sriov-cni daemon: metrics: cannot read the attachments' counters: {exc}\n")
        return
    yield from found


# Per-attachment traffic series.

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
