"""The sriov-cni daemon: runs the CNI plugins for the executables on the node.

The executables a container runtime runs, ``sriov`` and ``sriov-ipam``, are
either the static shim (shim/sriov-shim.c, on nodes without our Python) or
the Python client (:mod:`sriov_cni.daemon.client`). Both connect here and send
their version, their name, their working directory and environment, with
their stdin, stdout and stderr attached as descriptors. A child forked from
the daemon takes those over and runs exactly the code the executable would
run in process (:func:`sriov_cni.plugin.commands.run`, or the IPAM's
dispatch); the exit status goes back as one byte.  Starting Python and
importing pyroute2 is paid once, here, not per call.  A child serves one
call at a time, and up to CALLS_PER_CHILD in turn.

A call the daemon will not run (another version, a malformed, oversized or
stalled request, an unknown executable name) is answered with ``REFUSED``
and a CNI error object saying why. The shim prints that object; the Python
client instead runs the call in process, so an upgraded package is never
served by old code.

Only root may connect (checked with SO_PEERCRED), and the socket's directory
is made root-only.

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

import array
import gc
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from sriov_cni import __version__
from sriov_cni.cni import CNIError, Code
from sriov_cni.daemon import budget
from sriov_cni.daemon.client import DEFAULT_SOCKET, REFUSED, decode_request
from sriov_cni.kernel import lifetime

# The shim has the same limit compiled in (shim/sriov-shim.c MAX_HEADER).
MAX_HEADER = 1 << 20
# A caller that connects and then sends nothing (or half a request) must not
# hold a child, and a slot of MAX_CHILDREN, forever.
REQUEST_TIMEOUT = 10.0
# Each child is a forked copy of the daemon; calls beyond this wait in the
# listen queue until one ends, so a flood cannot exhaust the node's memory.
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
# Seconds a child that has served calls waits for another before it ends,
# giving back its copied pages (a burst of calls leaves as many children);
# the daemon forks fresh spares as needed.
CHILD_IDLE = 60.0
STATS_ENV = "SRIOV_CNI_DAEMON_STATS"
PROFILE_ENV = "SRIOV_CNI_DAEMON_PROFILE"

Program = Callable[[Mapping[str, str], bytes, IO[str], IO[str]], int]


class DaemonError(Exception):
    """The daemon cannot listen where it was asked to."""


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


def _recv_request(conn: socket.socket, timeout: float) -> tuple[tuple[str, str, str, dict[str, str]], list[int]]:
    deadline = time.monotonic() + timeout

    def until_deadline() -> socket.socket:
        # One bound for the whole request, not per read: a caller sending a
        # byte at a time must not hold the child longer.
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        return conn

    fds = array.array("i")
    msg, ancdata, _, _ = until_deadline().recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(msg) != 4 or len(fds) != 3:
        raise CNIError(Code.DECODE, "malformed request: no length or not three descriptors")
    (size,) = struct.unpack("!I", msg)
    if size > MAX_HEADER:
        raise CNIError(
            Code.INVALID_ENV,
            f"the request's environment and working directory take {size} bytes, "
            f"more than the {MAX_HEADER} the sriov-cni daemon accepts",
        )
    body = b""
    while len(body) < size:
        chunk = until_deadline().recv(size - len(body))
        if not chunk:
            raise CNIError(Code.DECODE, "truncated request")
        body += chunk
    return decode_request(body), list(fds)


def _become_caller(conn: socket.socket, request_timeout: float) -> tuple[str, Program, dict[str, str]]:
    """Take over the caller's descriptors, environment and directory."""
    try:
        (version, program, cwd, env), fds = _recv_request(conn, request_timeout)
    except TimeoutError:
        raise CNIError(Code.TRY_AGAIN, f"no complete request within {request_timeout:g} s") from None
    conn.settimeout(None)
    if version != __version__:
        raise CNIError(
            Code.TRY_AGAIN,
            f"version skew: the sriov-cni daemon is {__version__}, the {program} executable "
            f"is {version}; install the executables of the daemon's version "
            "(sriov-cni install-cni) or run the daemon of theirs",
        )
    run = PROGRAMS.get(program)
    if run is None:
        raise CNIError(
            Code.INVALID_ENV,
            f"the sriov-cni daemon runs {' and '.join(sorted(PROGRAMS))}, not {program!r}: "
            "install the shim under one of those names",
        )
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    try:
        os.chdir(cwd or "/")
    except OSError:
        # The caller's directory is a host path this pod may not have; the
        # plugins use none relative to it.
        os.chdir("/")
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    return program, run, env


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


def _serve_one(conn: socket.socket, request_timeout: float, watchdog: Watchdog, null: int,
               measure: Measure | None, name: str) -> bool:
    """Runs in a child, from the accepted connection to the answer.

    Whether the child may serve another call: not after a refusal, whose
    request may have left descriptors behind.
    """
    try:
        program, run, env = _become_caller(conn, request_timeout)
    except (OSError, ValueError) as exc:
        refusal = CNIError(Code.DECODE, f"unreadable request: {exc}")
    except CNIError as exc:
        refusal = exc
    else:

        def reply(code: int) -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            watchdog.answered.set()
            conn.sendall(bytes([code & 0xFF]))
            # The caller's runtime reads its stdout to the end, and this
            # child holds a copy: released now, not when the process ends
            # (exit tears the address space down before it closes files),
            # and not at all while the child waits for its next call.
            for fd in (0, 1, 2):
                os.dup2(null, fd)

        watchdog.watch(conn)
        stdin = sys.stdin.buffer.read()
        if measure is None:
            reply(run(env, stdin, sys.stdout, sys.stderr))
        else:
            _run_measured(program, run, env, stdin, measure, name, reply)
        return True
    # Nothing has run: the shim prints the reason, the Python client runs
    # the call itself.
    answer = json.dumps(refusal.to_dict("1.0.0"))
    conn.settimeout(request_timeout)
    conn.sendall(bytes([REFUSED]) + answer.encode() + b"\n")
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
        poller.register(self._conn.fileno(), select.POLLRDHUP)
        poller.poll()
        if not self.answered.is_set():
            os.killpg(0, signal.SIGKILL)


def _peer_is_root(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == 0)


def _next_call(listener: socket.socket, idle: float | None) -> socket.socket | None:
    """The next call from root, or None after ``idle`` seconds without one.

    The listener is non-blocking: every waiting child wakes for a call and
    all but one find it taken.
    """
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    while True:
        if not poller.poll(None if idle is None else int(idle * 1000)):
            return None
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            continue
        if _peer_is_root(conn):
            return conn
        conn.close()


def _spare(listener: socket.socket, daemon: int, messages: int, request_timeout: float, calls: int, idle: float,
           measure: Measure | None) -> None:
    """Runs in a forked child: serves calls one at a time until it ends.

    The daemon keeps such children forked ahead of the calls, so a call
    does not wait for the fork of the daemon (a copy of every page table of
    a 40 MiB interpreter), nor for its watchdog thread to start.  After a
    call the child tells the daemon it waits again (see CALLS_PER_CHILD).
    """
    idle_group = os.getpgid(0)
    # What the caller's descriptors become once a call has answered: they
    # must be released (its runtime reads to EOF) and 0-2 must stay taken,
    # or the next accepted connection would land on one of them.
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for served in range(calls):
        # An idle child ends with the daemon: it would hold the old socket
        # open, waiting for calls that can no longer reach it.
        lifetime.die_with_parent(daemon)
        if served:
            os.setpgid(0, idle_group)
            os.write(messages, struct.pack("=i", -os.getpid()))
        watchdog = Watchdog()
        conn = _next_call(listener, idle if served else None)
        if conn is None:
            return
        # Taken: a call runs to its end even when the daemon is restarted
        # meanwhile, as an executed plugin would.
        lifetime.outlive_parent()
        # The call's group: what it starts (delegated IPAM, helpers in a pod's
        # namespace) ends with it (Watchdog).
        os.setpgid(0, 0)
        os.write(messages, struct.pack("=i", os.getpid()))
        with conn:
            if not _serve_one(conn, request_timeout, watchdog, null, measure, f"{os.getpid()}-{served}"):
                return


class _Children:
    """The daemon's children: spares waiting for a call, and calls running."""

    def __init__(self, max_children: int) -> None:
        self.max = max_children
        self.spares: set[int] = set()
        self.busy: set[int] = set()
        # Children write their pid when they take a call and its negation
        # when they wait again, each in one write (atomic in a pipe).
        self.messages_r, self.messages_w = os.pipe()
        # SIGCHLD wakes the loop through a pipe of its own, so a spare that
        # died before taking a call is replaced without delay.
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def reap(self) -> None:
        while self.spares or self.busy:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            self.spares.discard(pid)
            self.busy.discard(pid)

    def wait(self) -> None:
        """Until a child takes a call, waits again, or ends."""
        poller = select.poll()
        poller.register(self.messages_r, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        for fd, _ in poller.poll():
            if fd == self.wake_r:
                while True:
                    try:
                        os.read(self.wake_r, 512)
                    except BlockingIOError:
                        break
            else:
                data = os.read(self.messages_r, 4 * 64)
                for (pid,) in struct.iter_unpack("=i", data):
                    # A pid not found was reaped already.
                    if pid > 0 and pid in self.spares:
                        self.spares.remove(pid)
                        self.busy.add(pid)
                    elif pid < 0 and -pid in self.busy:
                        self.busy.remove(-pid)
                        self.spares.add(-pid)
        self.reap()

    def in_child(self) -> None:
        """What a freshly forked child must not keep of the daemon's loop."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (self.messages_r, self.wake_r, self.wake_w):
            os.close(fd)


def _private_directory(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.stat(directory).st_mode & stat.S_ISVTX:
        # Making /tmp root-only would break the node; the socket needs a
        # directory of its own.
        raise DaemonError(f"{directory} is a shared directory (sticky bit): give the socket one of its own")
    # A hostPath DirectoryOrCreate (or an administrator) may have made it
    # 0755 already; the mode given to makedirs only applies to a new one.
    os.chmod(directory, 0o700)


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
          calls_per_child: int = CALLS_PER_CHILD, memory_budget: int | None = None) -> None:
    """Listen on ``path`` until terminated.

    ``memory_budget``: bytes the daemon and its children may hold, instead
    of its cgroup's limit.
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
    _private_directory(path)
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
    # Calls beyond the admitted children wait here, connected, for their
    # turn; a shim that finds the queue full gives up after 5 s.
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)  # see _next_call
    children = _Children(admitted.children)
    daemon = os.getpid()
    sys.stderr.write(f"sriov-cni daemon {__version__} listening on {path}, {admitted.describe()}\n")
    if unprotected:
        sys.stderr.write(f"sriov-cni daemon: warning: {unprotected}\n")
    sys.stderr.flush()
    while True:
        if len(children.spares) < SPARES and len(children.spares) + len(children.busy) < children.max:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                status = 1
                try:
                    budget.expose_child()
                    children.in_child()
                    _spare(listener, daemon, children.messages_w, request_timeout, calls_per_child, child_idle,
                           measure)
                    status = 0
                finally:  # the child must always reach _exit
                    os._exit(status)
            children.spares.add(pid)
        else:
            # With MAX_CHILDREN calls running, further ones wait in the
            # listen queue until a child waits again or ends.
            children.wait()


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SOCKET
    serve(path)


if __name__ == "__main__":
    main()
