"""The metrics exporter: the HTTP server Prometheus scrapes, a process of its own (``--metrics-address``).

The daemon's loop hands calls over; a scrape must neither stall it nor
compete with it for the interpreter lock.  So the HTTP server runs in a
process of its own, forked when the daemon starts (:func:`start`) and
ending with it.  It asks the daemon for its metrics' exposition
(:class:`~sriov_cni.daemon.metrics.Metrics`) on a socket pair the daemon's
loop watches (one small write per scrape), and reads the pool itself, at
scrape time, with the code of ``sriov-cni status``
(:func:`sriov_cni.node.status.current`), so the pool gauges are what
``status --json`` shows.  A stalled or slow scraper, or a node with many
VFs to read, holds only the exporter.  When it dies before the daemon (the
OOM killer takes it first), the daemon starts another (:class:`Exporter`,
the daemon's end of it).

The daemon is a hostNetwork pod: an address of the node given to
``--metrics-address`` is reachable wherever the node is, so metrics are off
unless asked for, and the DaemonSet binds the node's own address (the pod
IP), not every interface.
"""

from __future__ import annotations

import errno
import os
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sriov_cni.daemon import budget, metrics
from sriov_cni.daemon.metrics import Metrics
from sriov_cni.daemon.options import Options
from sriov_cni.kernel import lifetime
from sriov_cni.kernel.vfcontrol import KernelVfStats
from sriov_cni.kernel.vfsettings import VfStatsReader
from sriov_cni.node import rdmamode
from sriov_cni.paths import Paths

# Seconds the exporter waits for the daemon's loop to answer a scrape.
DAEMON_TIMEOUT = 5.0
# Seconds an exporter has to say it listens, or cannot.
START_TIMEOUT = 30.0
# Seconds before the daemon starts another exporter when one ended, doubled
# for each restart in a row (one that could not start, or ended within the
# maximum), up to the maximum.
RESTART_BACKOFF = 1.0
RESTART_BACKOFF_MAX = 60.0
# Room for the daemon's exposition in one message on the exporter's socket
# pair (a few tens of KiB with every command and result seen).
MAX_EXPOSITION = 4 << 20


class MetricsError(Exception):
    """The metrics cannot be served as asked."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as a host and a port; port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise MetricsError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9731, [::1]:9731)")
    return host, int(port)


@dataclass(frozen=True)
class _Launch:
    """How an exporter starts: where it listens, the pool it reads, and the OOM score it runs at."""

    address: tuple[str, int]
    data_dir: Path
    paths: Paths
    # The daemon's oom_score_adj before it protected itself (start).
    score: int | None
    # Where the attachments' VF counters are read (Options.vf_stats).
    vf_stats: Callable[[], VfStatsReader] = KernelVfStats


class Exporter:
    """The daemon's end of its exporter: answers each scrape with the registry's exposition.

    When the exporter ends (the OOM killer takes it before the daemon, or it
    crashed), the daemon starts another on the same address, after
    :data:`RESTART_BACKOFF` seconds, doubled for each restart in a row, so
    that an exporter that cannot start (its port taken by another process)
    or dies at once is not forked again and again.  The counters live here,
    in the daemon, so the new exporter serves them as they were.  Its start
    is an event of the loop like any other: the loop serves calls while it
    starts, and reads its first message (:func:`_listening`) when it comes.
    """

    def __init__(self, sock: socket.socket, alive: int, address: str, launch: _Launch, metrics: Metrics) -> None:
        # Closed while no exporter runs (or starts).
        self.sock = sock
        # The write end of the exporter's alive pipe, held as long as it is ours.
        self._alive = alive
        # Where the exporter listens, as bound (the port chosen for port 0):
        # a restarted one binds the same.
        self.address = address
        self._launch = replace(launch, address=parse_address(address))
        self._metrics = metrics
        self._selector: selectors.BaseSelector | None = None
        # Restarts since an exporter last served RESTART_BACKOFF_MAX seconds.
        self._backoff = lifetime.Backoff(RESTART_BACKOFF, RESTART_BACKOFF_MAX)
        self._serving_since = time.monotonic()
        # When the next exporter starts (none runs), or when the starting one
        # has to have said it listens.
        self._next_start: float | None = None
        self._start_deadline: float | None = None

    def serve_in(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        selector.register(self.sock, selectors.EVENT_READ, self._on_request)

    def _on_request(self) -> None:
        if (request := self._receive(64)) is None:
            return
        if not request:
            served = time.monotonic() - self._serving_since
            self._ended(
                f"the metrics exporter on {self.address} ended after {served:.0f} s", served >= RESTART_BACKOFF_MAX
            )
            return
        try:
            # The request's sequence number, then the exposition: the
            # exporter drops an answer that comes after it gave up.
            self.sock.send(request[:8] + self._metrics.exposition(), socket.MSG_DONTWAIT)
        except OSError:
            pass  # the exporter is not reading: it gives up on this scrape

    def _receive(self, size: int) -> bytes | None:
        """The exporter's next message; b"" once it ended, None when there is none yet."""
        try:
            return self.sock.recv(size, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def _ended(self, why: str, lasted: bool) -> None:
        """The exporter ended (``lasted``: after serving a while), or could not start: another, later."""
        assert self._selector is not None
        self._selector.unregister(self.sock)
        self.sock.close()
        # An exporter still starting reads the end of its pipe, and ends.
        os.close(self._alive)
        self._start_deadline = None
        if lasted:
            self._backoff.reset()
        delay = self._backoff.ended()
        self._next_start = time.monotonic() + delay
        # One line per exporter that ended or attempt that failed.
        sys.stderr.write(f"sriov-cni daemon: {why}; starting another in {delay:g} s\n")
        sys.stderr.flush()

    def next_deadline(self) -> float | None:
        """When the loop must call :meth:`tick` at the latest."""
        return self._next_start if self._next_start is not None else self._start_deadline

    def tick(self, now: float) -> None:
        """Start another exporter when its time came; give up on one that did not start in time."""
        if self._next_start is not None and now >= self._next_start:
            self._next_start = None
            self._restart()
        elif self._start_deadline is not None and now >= self._start_deadline:
            self._ended(f"the metrics exporter did not start again on {self.address} within {START_TIMEOUT:g} s", False)

    def _restart(self) -> None:
        assert self._selector is not None
        self.sock, self._alive = _fork(self._launch)
        self._start_deadline = time.monotonic() + START_TIMEOUT
        self._selector.register(self.sock, selectors.EVENT_READ, self._on_started)

    def _on_started(self) -> None:
        assert self._selector is not None
        if (answer := self._receive(4096)) is None:
            return
        try:
            address = _listening(answer)
        except MetricsError as exc:
            self._ended(f"the metrics exporter could not start again on {self.address}: {exc}", False)
            return
        self._start_deadline = None
        self._serving_since = time.monotonic()
        self._metrics.exporter_restarted()
        self._selector.modify(self.sock, selectors.EVENT_READ, self._on_request)
        sys.stderr.write(f"sriov-cni daemon: the metrics exporter serves on http://{address}/metrics again\n")
        sys.stderr.flush()


def _fork(launch: _Launch) -> tuple[socket.socket, int]:
    """Fork an exporter serving on ``address``: the daemon's end of its socket pair, and of its alive pipe.

    The exporter is forked twice, so the daemon, which reaps every child
    it has as a call's, never sees it: it waits here for the first fork
    only, which forks again and ends at once.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_EXPOSITION)
    # The exporter reads the end of this pipe when the daemon ends, however.
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the first fork, which only forks again
        try:
            if os.fork() == 0:
                _exporter(theirs, alive_r, launch)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    theirs.close()
    os.close(alive_r)
    # alive_w stays open, unwritten, as long as the daemon lives; the
    # call's children close it with every descriptor not theirs.
    return ours, alive_w


def _listening(answer: bytes) -> str:
    """The address an exporter's first message says it listens on; MetricsError saying why it cannot."""
    if answer[:1] != b"K":
        raise MetricsError(answer[1:].decode() or "the metrics exporter ended at start")
    return answer[1:].decode()


def start(address: tuple[str, int], options: Options, metrics: Metrics) -> Exporter:
    """Fork the exporter, serving ``metrics`` and the pool on ``address``; MetricsError when it cannot listen there.

    Called before the daemon listens or forks any child, and before it
    exempts itself from the OOM killer: the exporter need not be exempt.
    """
    # What a restarted exporter, forked once the daemon is exempt, sets its
    # own to: the value the kubelet gave the container (by its QoS class)
    # and this first exporter keeps.  Not 0: a restarted exporter should be
    # no more and no less the OOM killer's choice than the first one.
    launch = _Launch(
        address, options.data_dir, options.paths, budget.oom_score_adj(), options.vf_stats or KernelVfStats
    )
    ours, alive = _fork(launch)
    ready, _, _ = select.select([ours], [], [], START_TIMEOUT)
    answer = ours.recv(4096) if ready else f"Ethe metrics exporter did not start within {START_TIMEOUT:g} s".encode()
    try:
        bound = _listening(answer)
    except MetricsError:
        ours.close()
        os.close(alive)
        raise
    return Exporter(ours, alive, bound, launch, metrics)


class _Scrape(Collector):
    """In the exporter: the daemon's metrics, asked for at each scrape, and the pool, read then."""

    def __init__(self, daemon: socket.socket, launch: _Launch) -> None:
        self._daemon = daemon
        self._data_dir = launch.data_dir
        self._paths = launch.paths
        self._sources = metrics.Sources(launch.vf_stats, lambda: rdmamode.KernelRdmaModes().get())
        # Scrapes run in threads of their own; held by the exporter until
        # it told the daemon it listens (_exporter).
        self.lock = threading.Lock()
        self._sequence = 0

    def collect(self) -> Iterable[Metric]:
        text = self._ask_daemon()
        up = GaugeMetricFamily(
            "sriov_cni_daemon_up", f"Whether the daemon's loop answered this scrape within {DAEMON_TIMEOUT:g} s"
        )
        up.add_metric([], 0 if text is None else 1)
        yield up
        if text is not None:
            yield from text_string_to_metric_families(text)
        yield from metrics.pool(self._paths, self._data_dir)
        yield from metrics.attachments_or_none(self._paths, self._data_dir, self._sources)

    def _ask_daemon(self) -> str | None:
        with self.lock:
            self._sequence += 1
            sequence = struct.pack("=Q", self._sequence)
            deadline = time.monotonic() + DAEMON_TIMEOUT
            try:
                self._daemon.send(sequence)
                while (left := deadline - time.monotonic()) > 0:
                    ready, _, _ = select.select([self._daemon], [], [], left)
                    if not ready:
                        break
                    answer = self._daemon.recv(MAX_EXPOSITION)
                    if not answer:
                        break
                    if answer[:8] == sequence:
                        return answer[8:].decode()
            except OSError:
                pass
            return None


def _exporter(daemon: socket.socket, alive: int, launch: _Launch) -> None:  # pragma: no cover - runs in the exporter
    # Forked again from a running daemon, an exporter would hold its
    # listener, callers' connections and children's channels, and the
    # daemon's exemption from the OOM killer.
    lifetime.leave_daemon({0, 1, 2, daemon.fileno(), alive})
    budget.unprotect(launch.score)
    address = launch.address
    registry = CollectorRegistry()
    scrape = _Scrape(daemon, launch)
    registry.register(scrape)
    # Until the daemon knows it listens: its first message must be that one,
    # not a scrape's request, and a scraper comes at once to a restarted
    # exporter's address.
    with scrape.lock:
        # A restarted daemon's predecessor's exporter may hold the port for a
        # moment after that daemon ended: it ends once it reads so.
        deadline = time.monotonic() + 5
        while True:
            try:
                server, _ = prometheus_client.start_http_server(address[1], address[0], registry)
                break
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                daemon.send(b"E" + f"cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}".encode())
                return
        bound, port = server.server_address[:2]
        host = bound if isinstance(bound, str) else bound.decode()
        daemon.send(b"K" + (f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}").encode())
    # Until the daemon ends: its end of the pipe closes then.
    os.read(alive, 1)
