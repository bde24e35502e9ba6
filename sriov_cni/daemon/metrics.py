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
the daemon's loop for :meth:`Metrics.exposition` at each scrape.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sized
from dataclasses import dataclass
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
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sriov_cni import __version__, wire
from sriov_cni.cni import Code
from sriov_cni.daemon.child import Reported

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
