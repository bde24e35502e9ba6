"""The sriov-cni daemon: runs the CNI plugins for the executables on the node.

The executables a container runtime runs, ``sriov`` and ``sriov-ipam``, are
either the static shim (shim/sriov-shim.c, on nodes without our Python) or
the Python client (:mod:`sriov_cni.daemon.client`). Both connect here and send
their version, their name, their working directory and environment, with
their stdin, stdout and stderr attached as descriptors.  The daemon reads
each request itself (:mod:`intake`), so a caller that sends nothing holds no
child; a child forked from the daemon is handed the complete request, takes
the caller's descriptors over and runs exactly the code the executable
would run in process (:func:`sriov_cni.plugin.commands.run`, or the IPAM's
dispatch); the exit status goes back in the answer frame (:mod:`sriov_cni.wire`).
Starting Python and importing pyroute2 is paid once, here, not per call.
A child serves one call at a time, and up to CALLS_PER_CHILD in turn.

A call the daemon will not run (another version, a malformed, oversized or
stalled request, an unknown executable name, a caller that is not root)
is answered "refused" with a CNI error object saying why.  The shim
prints that object; the Python client instead runs the call in process,
so an upgraded package is never served by old code.

Only root may call (checked with SO_PEERCRED).  The socket's directory
is made root-only when it holds nothing else.

The daemon is started with one :class:`~options.Options` value.  It keeps
its children in :mod:`childpool`; what a child runs, and says to the
daemon, is :mod:`child`'s; :mod:`measure` says how to make them report
what each call cost.  The daemon's :class:`Metrics`
count what its loop sees, served by :mod:`exporter`.  Where the runtime
offers NRI, :mod:`nri` gives the containers of pods with an RDMA device
that device's character devices and a memlock limit.  :mod:`heal` gives back
the VFs of pods that died without a DEL.
"""

from __future__ import annotations

import gc
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass

from sriov_cni import __version__, safepath
from sriov_cni.cni import CNIError, Code
from sriov_cni.daemon import budget, childpool, heal, intake
from sriov_cni.daemon.child import PROGRAMS
from sriov_cni.daemon.exporter import Exporter
from sriov_cni.daemon.exporter import start as start_exporter
from sriov_cni.daemon.metrics import Metrics
from sriov_cni.daemon.options import Options

# Connections the daemon reads requests from at once (intake.Intake).
MAX_PENDING = 1024


class _Stop:
    """SIGTERM: take no new call, let the running ones end, then return from the loop.

    Kubernetes stops the DaemonSet's pod (an upgrade, a node drain) with
    SIGTERM, and kills every process left in the container once the daemon
    exits: a call cut short there fails "may have partly run".  So the calls
    children run go on to their end, within ``grace`` seconds; each call
    arriving meanwhile is refused, nothing of it run, and the runtime tries
    it again with the next daemon.
    """

    REFUSAL = CNIError(Code.TRY_AGAIN, "the sriov-cni daemon is stopping; nothing ran")

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.deadline: float | None = None
        self.announced = False
        signal.signal(signal.SIGTERM, self._requested)

    def _requested(self, signum: int, frame: object) -> None:
        # Only noted: the loop wakes through the wakeup fd, as for SIGCHLD.
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace

    def over(self, children: childpool.Children, calls: intake.Intake) -> bool:
        """Refuse what waits and end idle children; whether no call runs any more, or the grace is over."""
        calls.refuse_waiting(self.REFUSAL)
        children.end_waiting()
        if not self.announced:
            self.announced = True
            sys.stderr.write(
                f"sriov-cni daemon: stopping: new calls are refused, {children.running()} running "
                f"may take up to {self.grace:g} s\n"
            )
            sys.stderr.flush()
        assert self.deadline is not None
        return not children.channels or time.monotonic() >= self.deadline


def _warm_netlink() -> None:
    """Decode one link here, so that each child starts with the decoder warm.

    pyroute2 fills its message classes' attribute tables and caches on first
    use; done once in the daemon, every forked call inherits them.  The
    handle is closed before any fork: a netlink socket shared by two
    processes would deliver one's answers to the other.
    """
    from sriov_cni.kernel import netlink

    try:
        with netlink.open_namespace() as host:
            host.find("lo")
    except netlink.NetlinkError:
        pass  # only a head start lost; the calls open their own handles


def _warm_up(options: Options) -> None:
    """Import and warm everything a call needs, in the parent, so each child starts warm."""
    import sriov_cni.ipam.main
    import sriov_cni.plugin.commands  # noqa: F401

    _warm_netlink()
    # What the imports and the warm-up built lives as long as the daemon.
    # Frozen, it is left out of every child's collections: a full one walked
    # its ~35,000 objects for 40-50 ms of a call, and wrote to their pages,
    # which the fork had shared.
    gc.freeze()
    if options.measure is not None:
        import cProfile  # noqa: F401  imported once here, not in every measured call
        import resource  # noqa: F401


def _listen(path: str) -> socket.socket:
    """The daemon's socket at ``path``, root-only, non-blocking: waiting children poll it."""
    # Private when the directory is ours; an existing one holding others'
    # files (/run) is used as it is, and refused when others may write it.
    # The socket itself is root-only either way (the umask below).
    safepath.private_dir(os.path.dirname(os.path.abspath(path)), os.path.basename(path), "socket directory")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    return listener


def serve(options: Options) -> int:
    """Listen on the options' socket until SIGTERM, then wait up to their drain timeout for the calls running.

    Returns how many calls still ran when it stopped.
    """
    _warm_up(options)
    # Only when served: counting costs the loop a little on every call.
    address = options.metrics_address
    metrics = None if address is None else Metrics()
    # Before the daemon exempts itself from the OOM killer: the exporter
    # need not be (a restarted one undoes the exemption it inherits).
    served = None if address is None or metrics is None else start_exporter(address, options, metrics)
    # Read before the daemon exempts itself, for the NRI plugin's process.
    score = budget.oom_score_adj()
    admitted = budget.admission(options.max_children, options.memory_budget)
    unprotected = budget.protect_daemon()
    listener = _listen(options.socket)
    max_pending = _descriptors_for(MAX_PENDING, admitted.children)
    selector = selectors.DefaultSelector()
    children = childpool.Children(admitted, options, metrics)
    selector.register(children.messages_r, selectors.EVENT_READ, children.on_messages)
    selector.register(children.wake_r, selectors.EVENT_READ, children.on_wake)
    calls = intake.Intake(
        listener,
        selector,
        options.request_timeout,
        max_pending,
        admitted.pending_bytes,
        metrics.refused if metrics is not None else lambda code: None,
        PROGRAMS,
    )
    # Before the banner: a SIGTERM from then on drains the calls.
    stop = _Stop(options.drain_timeout)
    if metrics is not None and served is not None:
        metrics.watch(children, calls)
        served.serve_in(selector)
    where = "" if served is None else f", metrics on http://{served.address}/metrics"
    nri_note = "" if options.nri_socket is None else f", NRI plugin for {options.nri_socket}"
    sys.stderr.write(
        f"sriov-cni daemon {__version__} listening on {options.socket}, {admitted.describe()}{nri_note}{where}\n"
    )
    sys.stderr.flush()
    # After the banner, which the daemon's first line must be: the plugin
    # writes its own.  Its end of the alive pipe is held open, never
    # written, as long as the daemon lives: the plugin ends when it closes.
    if options.nri_socket is not None:
        _start_nri(options, score)
    if options.heal:
        _start_healing(options, score, metrics, selector)
    if unprotected:
        sys.stderr.write(f"sriov-cni daemon: warning: {unprotected}\n")
    sys.stderr.flush()
    return _Loop(selector, children, calls, stop, served).run()


def _start_nri(options: Options, score: int | None) -> int:
    """Fork the NRI plugin (daemon.nri) at OOM score ``score``; the daemon's end of its alive pipe."""
    from sriov_cni.daemon import nri

    assert options.nri_socket is not None
    return nri.start(nri.Launch(options.nri_socket, options.data_dir, options.paths.sys, score))


def _start_healing(
    options: Options, score: int | None, metrics: Metrics | None, selector: selectors.BaseSelector
) -> int:
    """Fork the healing process (daemon.heal), its reports counted in ``metrics``; the daemon's end of its alive pipe."""
    alive, reports = heal.start(heal.Launch(options.data_dir, options.paths, score))
    unfinished = b""

    def on_reports() -> None:
        nonlocal unfinished
        pairs, unfinished, ended = heal.read_reports(reports, unfinished)
        for why, result in pairs:
            if metrics is not None:
                metrics.given_back(why, result)
        if ended:
            selector.unregister(reports)
            os.close(reports)
            sys.stderr.write("sriov-cni daemon: the healing process ended; stale VFs wait for an ADD to reclaim them\n")
            sys.stderr.flush()

    selector.register(reports, selectors.EVENT_READ, on_reports)
    return alive


@dataclass
class _Loop:
    """What the daemon's loop turns: its selector, children, calls being read, stop, and exporter."""

    selector: selectors.BaseSelector
    children: childpool.Children
    calls: intake.Intake
    stop: _Stop
    exporter: Exporter | None

    def run(self) -> int:
        """Hand calls to children, keep spares forked, until a stop ends; how many calls still ran then."""
        children, calls, stop = self.children, self.calls, self.stop
        while True:
            if stop.deadline is not None:
                if stop.over(children, calls):
                    return children.running()
            while stop.deadline is None and children.may_fork(time.monotonic()):
                children.fork()
            # With MAX_CHILDREN calls running, further ones wait here until a
            # child waits again or ends.
            while children.waiting and children.running() < children.max and (call := calls.take()) is not None:
                if not children.hand(call):
                    calls.put_back(call)
            if (broken := children.cannot_start()) is not None:
                calls.refuse_waiting(broken)
            for key, _ in self.selector.select(self._timeout()):
                key.data()
            now = time.monotonic()
            calls.expire(now)
            children.retire(now)
            if self.exporter is not None:
                self.exporter.tick(now)

    def _timeout(self) -> float | None:
        """Seconds the loop may wait for an event: until the next deadline of a call, child, stop or exporter."""
        children = self.children
        restart = None if self.exporter is None else self.exporter.next_deadline()
        deadlines = [
            t
            for t in (self.calls.next_deadline(), children.next_retirement(), self.stop.deadline, restart)
            if t is not None
        ]
        if children.spares() < childpool.SPARES and children.next_fork > time.monotonic():
            deadlines.append(children.next_fork)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None


def _descriptors_for(pending: int, max_children: int) -> int:
    """How many connections the daemon may read at once, raising its descriptor limit for them.

    Each holds four descriptors once its caller's three came; the common
    default soft limit of 1024 would cap them at a few hundred.
    """
    import resource

    reserve = 64 + 2 * max_children
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = reserve + 4 * pending
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return pending if soft == resource.RLIM_INFINITY else max(1, min(pending, (soft - reserve) // 4))
