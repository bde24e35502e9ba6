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
dispatch); the exit status goes back in the answer frame (:mod:`wire`).
Starting Python and importing pyroute2 is paid once, here, not per call.
A child serves one call at a time, and up to CALLS_PER_CHILD in turn.

A call the daemon will not run (another version, a malformed, oversized or
stalled request, an unknown executable name, a caller that is not root)
is answered "refused" with a CNI error object saying why.  The shim
prints that object; the Python client instead runs the call in process,
so an upgraded package is never served by old code.

Only root may call (checked with SO_PEERCRED).  The socket's directory
is made root-only when it holds nothing else.

For measuring a node, the daemon started with ``SRIOV_CNI_DAEMON_STATS`` set
to a directory makes each child write there, after answering, what its call
cost: ``<pid>-<n>.json`` for its n-th call (from 0), with the program, the
CNI command, the seconds it ran and the CPU seconds it used, the child's
peak memory (over its calls so far) and private memory, and each VF claim
it tried (seconds taken, whether it got the claim).
With ``SRIOV_CNI_DAEMON_PROFILE=1`` as well, the call runs under cProfile and
``<pid>-<n>.prof`` holds the dump (tests/bench/bench_plugin.py reads both).
Unset, nothing is measured.
"""

from __future__ import annotations

import gc
import json
import math
import os
import select
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from sriov_cni import __version__, safepath
from sriov_cni.cni import MAX_CONFIG, CNIError, Code
from sriov_cni.daemon import budget, intake, wire
from sriov_cni.daemon.client import DEFAULT_SOCKET
from sriov_cni.kernel import lifetime

# Seconds a caller has to send its request, and then to end its stdin: one
# that sends nothing (or half a request) must not hold a connection slot,
# nor a child, forever.
REQUEST_TIMEOUT = 10.0
# Each child is a forked copy of the daemon; calls beyond this wait in the
# daemon until one ends, so a flood cannot exhaust the node's memory.
# The daemon's memory budget lowers it further (budget.admission).
MAX_CHILDREN = 64
# Children forked ahead, each waiting to take the next call.  Two, so that
# a second call arriving at once need not wait for its fork either.
SPARES = 2
# A child serves calls one after another, up to this many (--calls-per-child):
# the first call in a forked child copies every page it writes (about a
# thousand per ADD, a tenth of a millisecond each on a slow node), the next
# ones find them copied.  Bounded, so what one call might leave behind
# cannot pile up; 1 gives every call a fresh child.
CALLS_PER_CHILD = 100
# Seconds before forking again after a child ended at start, doubled for
# each such end in a row, up to the maximum.
START_BACKOFF = 0.5
START_BACKOFF_MAX = 30.0
# Connections the daemon reads requests from at once (intake.Intake).
MAX_PENDING = 1024
# Seconds a child that has served calls waits for another before it ends,
# giving back its copied pages (a burst of calls leaves as many children);
# the daemon forks fresh spares as needed.
CHILD_IDLE = 60.0
# Seconds a stopping daemon (SIGTERM) waits for the calls it runs to end
# (--drain-timeout); the DaemonSet's terminationGracePeriodSeconds is above.
DRAIN_TIMEOUT = 20.0
STATS_ENV = "SRIOV_CNI_DAEMON_STATS"
PROFILE_ENV = "SRIOV_CNI_DAEMON_PROFILE"

Program = Callable[[Mapping[str, str], bytes, IO[str], IO[str]], int]


def _run_sriov(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str]) -> int:
    from sriov_cni.plugin import commands, log

    commands.configure_logging_from_env(env)
    try:
        return commands.run(env, stdin, stdout, stderr)
    finally:
        # The child serves other calls after this one (CALLS_PER_CHILD).
        log.close()


def _run_ipam(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str]) -> int:
    from ipam import main as ipam_main
    from sriov_cni.cni import dispatch

    return dispatch(ipam_main.HANDLERS, env, stdin, stdout, stderr, ipam_main.ABOUT)


PROGRAMS: dict[str, Program] = {"sriov": _run_sriov, "sriov-ipam": _run_ipam}


def _become_caller(call: intake.Call) -> tuple[str, Program, dict[str, str]]:
    """Take over the caller's descriptors, environment and directory."""
    _, program, cwd, env = wire.decode_request(call.body)
    run = PROGRAMS[program]  # intake.check_request made sure
    for target, fd in enumerate(call.fds):
        os.dup2(fd, target)
        os.close(fd)
    try:
        os.chdir(cwd or "/")
    except OSError:
        # The caller's directory is a host path this pod may not have; the
        # plugins use none relative to it.
        os.chdir("/")
    os.environ.clear()
    # An entry with an empty name (``=x``) stays in the plugin's env, as it
    # does for a plugin run directly, but the C library cannot set it.
    os.environ.update({key: value for key, value in env.items() if key})
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    return program, run, env


def _read_stdin(timeout: float) -> bytes:
    """The caller's stdin to its end, bounded as cni.read_config bounds it.

    Within ``timeout`` seconds: a caller that never closes its stdin must
    not hold this child.
    """
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(0, select.POLLIN)
    data = bytearray()
    while len(data) <= MAX_CONFIG:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(math.ceil(left * 1000)):
            raise CNIError(Code.TRY_AGAIN, f"the caller's stdin did not end within {timeout:g} s; nothing ran")
        try:
            chunk = os.read(0, MAX_CONFIG + 1 - len(data))
        except BlockingIOError:  # the caller made its stdin non-blocking
            continue
        if not chunk:
            break
        data += chunk
    return bytes(data)


@dataclass(frozen=True)
class Measure:
    """Where each child writes what its call cost, and whether under cProfile."""

    directory: str
    profile: bool

    @classmethod
    def from_env(cls) -> Measure | None:
        directory = os.environ.get(STATS_ENV)
        return cls(directory, os.environ.get(PROFILE_ENV) == "1") if directory else None


def _private_kib() -> int:
    """Memory only this child holds: pages it wrote after the fork, or mapped anew."""
    total = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def _run_measured(program: str, run: Program, env: dict[str, str], stdin: bytes, measure: Measure, name: str,
                  reply: Callable[[int], None]) -> None:
    import cProfile
    import resource

    from sriov_cni.plugin import store

    store.claim_times = []
    profiler = cProfile.Profile() if measure.profile else None
    start, cpu_start = time.perf_counter(), time.process_time()
    if profiler is not None:
        code = profiler.runcall(run, env, stdin, sys.stdout, sys.stderr)
    else:
        code = run(env, stdin, sys.stdout, sys.stderr)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    reply(code)  # closes the caller's stdout before the statistics are gathered
    base = os.path.join(measure.directory, name)
    if profiler is not None:
        profiler.dump_stats(base + ".prof")
    stats = {
        "program": program,
        "command": env.get("CNI_COMMAND", ""),
        "container": env.get("CNI_CONTAINERID", ""),
        "status": code,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "private_kib": _private_kib(),
        "claims": store.claim_times,
    }
    # Renamed into place: a reader sees a whole file or none.
    with open(base + ".tmp", "w") as f:
        json.dump(stats, f)
    os.rename(base + ".tmp", base + ".json")


def _serve_one(call: intake.Call, request_timeout: float, watchdog: Watchdog, null: int,
               measure: Measure | None, name: str) -> bool:
    """Runs in a child, from the call handed over to the answer.

    Whether the child may serve another call: not after a refusal.
    """
    conn = call.conn
    program, run, env = _become_caller(call)

    def reply(code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass  # the caller closed its end: the call ran all the same
        watchdog.answered.set()
        try:
            conn.sendall(wire.exited(code))
            # The end of the answer, now: the watchdog's poll holds the
            # connection open, and a caller reading to the end of the
            # stream would wait for it as long as the watchdog waits for
            # that caller to hang up.
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the caller hung up after the call ran
        # The caller's runtime reads its stdout to the end, and this
        # child holds a copy: released now, not when the process ends
        # (exit tears the address space down before it closes files),
        # and not at all while the child waits for its next call.
        for fd in (0, 1, 2):
            os.dup2(null, fd)

    watchdog.watch(conn)
    try:
        stdin = _read_stdin(request_timeout)
    except OSError as exc:
        refusal = CNIError(Code.IO_FAILURE, f"cannot read the caller's stdin: {exc.strerror}; nothing ran")
    except CNIError as exc:
        refusal = exc
    else:
        if measure is None:
            reply(run(env, stdin, sys.stdout, sys.stderr))
        else:
            _run_measured(program, run, env, stdin, measure, name, reply)
        return True
    # Nothing has run: the shim prints the reason, the Python client runs
    # the call itself.
    watchdog.answered.set()
    conn.settimeout(request_timeout)
    conn.sendall(intake.refusal_frame(refusal))
    return False


class Watchdog:
    """Ends this child when its caller hangs up before the answer.

    A runtime that gives up on a call kills the executable it ran, the shim.
    The call's child must end with it, as an executed plugin would, and so
    must what it started: a call (or its delegated IPAM) that finished later
    would race the runtime's next call for the same pod (a DEL whose IPAM
    wakes up after a re-ADD releases the live pod's address).  The records
    make a call killed at any point safe to repeat.

    The thread starts before a call arrives (:func:`_spare`), so a call does
    not wait for it.
    """

    def __init__(self) -> None:
        self.answered = threading.Event()
        self._conn: socket.socket | None = None
        self._given = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def watch(self, conn: socket.socket) -> None:
        self._conn = conn
        self._given.set()

    def _run(self) -> None:
        self._given.wait()
        assert self._conn is not None
        poller = select.poll()
        try:
            poller.register(self._conn.fileno(), select.POLLRDHUP)
        except ValueError:
            # Closed already (fileno -1): the call ended, its caller killed
            # or answered, before this thread began to watch.  Raising here
            # would print a traceback into the caller's stderr.
            return
        poller.poll()
        if not self.answered.is_set():
            os.killpg(0, signal.SIGKILL)


def _spare(channel: socket.socket, daemon: int, messages: int, request_timeout: float, calls: int,
           measure: Measure | None) -> None:
    """Runs in a forked child: serves the calls the daemon hands it, one at a time, until it ends.

    The daemon keeps such children forked ahead of the calls, so a call
    does not wait for the fork of the daemon (a copy of every page table of
    a 40 MiB interpreter), nor for its watchdog thread to start.  The child
    tells the daemon each time it waits for a call (see CALLS_PER_CHILD);
    the daemon hands it one on its channel, or closes the channel to end
    it (CHILD_IDLE).
    """
    idle_group = os.getpgid(0)
    # What the caller's descriptors become once a call has answered: they
    # must be released (its runtime reads to EOF) and 0-2 must stay taken,
    # or the next call's descriptors would land on one of them.
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for served in range(calls):
        # An idle child ends with the daemon, as its channel does.
        lifetime.die_with_parent(daemon)
        if served:
            os.setpgid(0, idle_group)
        watchdog = Watchdog()
        os.write(messages, struct.pack("=i", os.getpid()))
        call = intake.take_over(channel)
        if call is None:
            return
        # Taken: a call runs to its end even when the daemon is restarted
        # meanwhile, as an executed plugin would.
        lifetime.outlive_parent()
        # The call's group: what it starts (delegated IPAM, helpers in a pod's
        # namespace) ends with it (Watchdog).
        os.setpgid(0, 0)
        with call.conn:
            if not _serve_one(call, request_timeout, watchdog, null, measure, f"{os.getpid()}-{served}"):
                return


class _Children:
    """The daemon's children: each starting, waiting for a call, or running one."""

    def __init__(self, max_children: int, idle: float) -> None:
        self.max = max_children
        self.idle = idle
        # The daemon's end of each child's channel (intake.hand_over).
        self.channels: dict[int, socket.socket] = {}
        self.starting: set[int] = set()
        # Since when each waits; one that has served calls ends after ``idle``.
        self.waiting: dict[int, float] = {}
        self.served: set[int] = set()
        # Children that ended before they could wait for a call (a broken
        # install) since one last could: forks are spaced out meanwhile.
        self.failures = 0
        self.next_fork = 0.0
        self.failure = ""
        # Children write their pid each time they wait for a call, in one
        # write (atomic in a pipe).
        self.messages_r, self.messages_w = os.pipe2(os.O_CLOEXEC)
        # SIGCHLD wakes the loop through a pipe of its own, so a spare that
        # died before taking a call is replaced without delay.
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def spares(self) -> int:
        return len(self.starting) + len(self.waiting)

    def fork(self, run: Callable[[socket.socket], None]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            status = 1
            try:
                budget.expose_child()
                self._in_child(theirs)
                run(theirs)
                status = 0
            finally:  # the child must always reach _exit
                os._exit(status)
        theirs.close()
        self.channels[pid] = ours
        self.starting.add(pid)

    def _in_child(self, channel: socket.socket) -> None:
        """Keep nothing of the daemon's loop but this child's channel and the messages pipe.

        In particular no other caller's connection: a caller refused by
        the daemon reads its answer to the end of the connection, which
        does not come while a copy stays open here.
        """
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        keep = {0, 1, 2, channel.fileno(), self.messages_w}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass  # the directory's own descriptor, closed by now

    def hand(self, call: intake.Call) -> bool:
        """Give ``call`` to a waiting child; False when none could take it."""
        while self.waiting:
            # The one that waited last: its pages are the warmest, and the
            # others may reach their idle end.
            pid = max(self.waiting, key=self.waiting.__getitem__)
            del self.waiting[pid]
            try:
                intake.hand_over(self.channels[pid], call)
            except OSError:
                continue  # it ended meanwhile; reaped with the next SIGCHLD
            self.served.add(pid)
            return True
        return False

    def on_messages(self) -> None:
        data = os.read(self.messages_r, 4 * 64)
        now = time.monotonic()
        for (pid,) in struct.iter_unpack("=i", data):
            # A pid not found was reaped already.
            if pid in self.channels:
                if pid in self.starting:
                    self.starting.remove(pid)
                    self.failures = 0
                self.waiting[pid] = now

    def on_wake(self) -> None:
        while True:
            try:
                os.read(self.wake_r, 512)
            except BlockingIOError:
                break
        self.reap()

    def may_fork(self, now: float) -> bool:
        if self.failures and self.starting:
            return False  # one at a time, until one starts
        return self.spares() < SPARES and len(self.channels) < self.max and now >= self.next_fork

    def reap(self) -> None:
        while self.channels:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self.channels.pop(pid).close()
            if pid in self.starting:
                self.starting.remove(pid)
                self._failed_at_start(status)
            self.waiting.pop(pid, None)
            self.served.discard(pid)

    def _failed_at_start(self, status: int) -> None:
        """A child ended before it could take a call: fork again only after a while.

        Forking again at once, forever, would turn a broken install (an
        import error in every child) into a fork loop on every core.
        """
        self.failures += 1
        delay = min(START_BACKOFF * 2 ** (self.failures - 1), START_BACKOFF_MAX)
        self.next_fork = time.monotonic() + delay
        if os.WIFSIGNALED(status):
            self.failure = f"killed by signal {os.WTERMSIG(status)}"
        else:
            self.failure = f"exit status {os.waitstatus_to_exitcode(status)}"
        # Once per interval: the next failure comes after the next fork.
        sys.stderr.write(f"sriov-cni daemon: a child ended before it could take calls ({self.failure}, "
                         f"{self.failures} in a row); the next fork in {delay:g} s\n")
        sys.stderr.flush()

    def cannot_start(self) -> CNIError | None:
        """Why calls cannot run now: children end at start and none waits."""
        if not self.failures or self.waiting:
            return None
        return CNIError(Code.TRY_AGAIN, f"the sriov-cni daemon's children end before they can take calls "
                                        f"({self.failure}; see the daemon's log), and it forks them again only "
                                        "after a while; nothing ran")

    def next_retirement(self) -> float | None:
        times = [since + self.idle for pid, since in self.waiting.items() if pid in self.served]
        return min(times, default=None)

    def retire(self, now: float) -> None:
        """End the children that have served calls and waited ``idle`` since, giving back their pages."""
        for pid, since in list(self.waiting.items()):
            if pid in self.served and since + self.idle <= now:
                del self.waiting[pid]
                self.channels[pid].close()  # the child reads the end of its channel and ends

    def end_waiting(self) -> None:
        for pid in list(self.waiting):
            del self.waiting[pid]
            self.channels[pid].close()

    def running(self) -> int:
        """Children running a call: neither starting, waiting, nor ending (their channel closed)."""
        return sum(1 for pid, channel in self.channels.items()
                   if channel.fileno() != -1 and pid not in self.starting and pid not in self.waiting)


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

    def over(self, children: _Children, calls: intake.Intake) -> bool:
        """Refuse what waits and end idle children; whether no call runs any more, or the grace is over."""
        calls.refuse_waiting(self.REFUSAL)
        children.end_waiting()
        if not self.announced:
            self.announced = True
            sys.stderr.write(f"sriov-cni daemon: stopping: new calls are refused, {children.running()} running "
                             f"may take up to {self.grace:g} s\n")
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
        with netlink.namespace() as host:
            host.find("lo")
    except netlink.NetlinkError:
        pass  # only a head start lost; the calls open their own handles


def serve(path: str = DEFAULT_SOCKET, request_timeout: float = REQUEST_TIMEOUT,
          max_children: int = MAX_CHILDREN, child_idle: float = CHILD_IDLE,
          calls_per_child: int = CALLS_PER_CHILD, memory_budget: int | None = None,
          drain_timeout: float = DRAIN_TIMEOUT) -> int:
    """Listen on ``path`` until SIGTERM, then wait up to ``drain_timeout`` seconds for the calls running.

    ``memory_budget``: bytes the daemon and its children may hold, instead
    of its cgroup's limit.  Returns how many calls still ran when it stopped.
    """
    # Import everything a request needs now, in the parent, so each child
    # starts warm.
    import ipam.main  # noqa: F401
    import sriov_cni.plugin.commands  # noqa: F401

    _warm_netlink()
    # What the imports and the warm-up built lives as long as the daemon.
    # Frozen, it is left out of every child's collections: a full one walked
    # its ~35,000 objects for 40-50 ms of a call, and wrote to their pages,
    # which the fork had shared.
    gc.freeze()
    measure = Measure.from_env()
    if measure is not None:
        import cProfile  # noqa: F401  imported once here, not in every measured call
        import resource  # noqa: F401
    admitted = budget.admission(max_children, memory_budget)
    unprotected = budget.protect_daemon()
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
    max_pending = _descriptors_for(MAX_PENDING, admitted.children)
    selector = selectors.DefaultSelector()
    children = _Children(admitted.children, child_idle)
    selector.register(children.messages_r, selectors.EVENT_READ, children.on_messages)
    selector.register(children.wake_r, selectors.EVENT_READ, children.on_wake)
    calls = intake.Intake(listener, selector, request_timeout, PROGRAMS, max_pending)
    stop = _Stop(drain_timeout)
    daemon = os.getpid()

    def spare(channel: socket.socket) -> None:
        _spare(channel, daemon, children.messages_w, request_timeout, calls_per_child, measure)

    sys.stderr.write(f"sriov-cni daemon {__version__} listening on {path}, {admitted.describe()}\n")
    if unprotected:
        sys.stderr.write(f"sriov-cni daemon: warning: {unprotected}\n")
    sys.stderr.flush()
    while True:
        if stop.deadline is not None:
            if stop.over(children, calls):
                return children.running()
        while stop.deadline is None and children.may_fork(time.monotonic()):
            children.fork(spare)
        # With MAX_CHILDREN calls running, further ones wait here until a
        # child waits again or ends.
        while children.waiting and (call := calls.take()) is not None:
            if not children.hand(call):
                calls.put_back(call)
        if (broken := children.cannot_start()) is not None:
            calls.refuse_waiting(broken)
        deadlines = [t for t in (calls.next_deadline(), children.next_retirement(), stop.deadline) if t is not None]
        if children.spares() < SPARES and children.next_fork > time.monotonic():
            deadlines.append(children.next_fork)
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        for key, _ in selector.select(timeout):
            key.data()
        now = time.monotonic()
        calls.expire(now)
        children.retire(now)


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


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SOCKET
    serve(path)


if __name__ == "__main__":
    main()
