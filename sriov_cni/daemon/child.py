"""What a call's child runs: waiting for a call, serving it, and telling the daemon of it.

The daemon (:mod:`childpool`) forks its children ahead of the calls; each
runs :func:`spare` until it ends.  A call handed over (:func:`take_over`)
is a complete, checked request (:class:`intake.Call`): the child takes the
caller's descriptors, environment and working directory over
(:func:`serve_one`), runs the program the caller named (:data:`PROGRAMS`,
exactly the code the executable would run in process, on the node the
daemon was started for) and answers with its exit status
(:mod:`sriov_cni.wire`), while its :class:`Watchdog` ends it if the
caller hangs up first.  Then it sends the daemon a :class:`Report` of the
call and says it is ready again.

What the daemon and a child say to each other:

- *ready*: a child writes its pid on the daemon's messages pipe each time it
  waits for a call (:func:`say_ready`, read by ``childpool.ready_pids``),
  one write, atomic in a pipe;
- *the hand-over*: the daemon sends a call on the child's own channel, a
  SOCK_SEQPACKET pair (``childpool.hand_over``, :func:`take_over`), or
  closes the channel to end the child;
- *the report*: once it answered its caller, and before it says it is
  ready again, the child sends a :class:`Report` of the call on its channel
  (the CNI error code its caller read, the seconds from taking the call to
  the answer, the VF claims it found held, and the memory it alone holds
  now), which the daemon reads (``childpool.reports``) for its metrics and
  its memory budget's cap.

A child may be SIGKILLed at any point (by its watchdog when its caller
hangs up, or by the OOM killer), so it keeps nothing the daemon needs:
whatever it did not report, the daemon knows from having handed the call.
"""

from __future__ import annotations

import io
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from sriov_cni import wire
from sriov_cni.cni import MAX_CONFIG, CNIError, Code
from sriov_cni.daemon import budget, intake
from sriov_cni.daemon.measure import ClaimTimes, run_measured
from sriov_cni.daemon.options import Options
from sriov_cni.kernel import lifetime
from sriov_cni.paths import Paths
from sriov_cni.vfstore import Store

# What a child writes on the messages pipe when it waits: its pid.
READY = struct.Struct("=i")

# Bytes of a call's stdout kept to read its error code from: an error object
# is a few hundred; a longer output is a result, and its status 0.
KEEP = 1 << 16


@dataclass(frozen=True)
class Host:
    """What a call acts on: the node's paths, and the VF store it opens (the daemon times its claims)."""

    paths: Paths
    store: Callable[[str], Store]


Program = Callable[[Mapping[str, str], bytes, IO[str], IO[str], Host], int]


def _run_sriov(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str], host: Host) -> int:
    from sriov_cni import log
    from sriov_cni.plugin import commands

    log.configure_from_env(commands.PROGRAM, env)
    try:
        return commands.run(env, stdin, stdout, stderr, commands.Deps(paths=host.paths, store=host.store))
    finally:
        # The child serves other calls after this one (options.CALLS_PER_CHILD).
        log.close()


def _run_ipam(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str], host: Host) -> int:
    from sriov_cni import log
    from sriov_cni.cni import dispatch
    from sriov_cni.ipam import main as ipam_main

    log.configure_from_env(ipam_main.PROGRAM, env)
    try:
        return dispatch(ipam_main.HANDLERS, env, stdin, stdout, stderr, ipam_main.ABOUT)
    finally:
        log.close()


PROGRAMS: dict[str, Program] = {"sriov": _run_sriov, "sriov-ipam": _run_ipam}


class Watchdog:
    """Ends this child when its caller hangs up before the answer.

    A runtime that gives up on a call kills the executable it ran, the shim.
    The call's child must end with it, as an executed plugin would, and so
    must what it started: a call (or its delegated IPAM) that finished later
    would race the runtime's next call for the same pod (a DEL whose IPAM
    wakes up after a re-ADD releases the live pod's address).  The records
    make a call killed at any point safe to repeat.

    The thread starts before a call arrives (:func:`spare`), so a call does
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


def say_ready(messages: int) -> None:
    """In a child: it waits for a call now (its pid on the daemon's ``messages`` pipe)."""
    os.write(messages, READY.pack(os.getpid()))


def take_over(channel: socket.socket) -> intake.Call | None:
    """The call the daemon handed to this child; None when the daemon closed the channel."""
    msg, fds, _, _ = socket.recv_fds(channel, 1, wire.DESCRIPTORS + 2)
    if not msg:
        return None
    conn, *caller, body = fds
    try:
        # At offset 0: the daemon's writes moved the offset this copy shares.
        data = os.pread(body, os.fstat(body).st_size, 0)
    finally:
        os.close(body)
    return intake.Call(socket.socket(fileno=conn), caller, data)


class _Tee(io.RawIOBase):
    """A descriptor written through, keeping the first KEEP bytes written (``kept`` None: none).

    Once its call has answered (:meth:`drop`), what is written is dropped: a
    caller that hung up before the answer was flushed leaves it in the
    stream's buffer, and the stream flushes it when it is collected, by then
    onto the descriptor of the next call's caller, whose output then held
    two answers.
    """

    def __init__(self, fd: int, kept: bytearray | None) -> None:
        super().__init__()
        self._fd = fd
        self._kept = kept
        self._dropping = False

    def drop(self) -> None:
        self._dropping = True

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        if self._dropping:
            return len(memoryview(data))
        written = os.write(self._fd, data)
        if self._kept is not None and len(self._kept) < KEEP:
            self._kept += bytes(memoryview(data)[: min(written, KEEP - len(self._kept))])
        return written


class Report:
    """What a child tells the daemon about the call it took: made as it takes it, sent once answered."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._seconds = 0.0
        self._result = ""
        self._out = bytearray()
        self._tees: list[_Tee] = []
        self._claims_refused = 0
        self._private = 0
        # Whether the call was refused, nothing of it run.
        self.refusal = False

    def stdout(self) -> IO[str]:
        """The caller's stdout (descriptor 1), as ``open(1, "w")`` would give it, keeping what the call writes."""
        tee = _Tee(1, self._out)
        self._tees.append(tee)
        return io.TextIOWrapper(io.BufferedWriter(tee))

    def stderr(self) -> IO[str]:
        """The caller's stderr (descriptor 2), as ``open(2, "w")`` would give it."""
        tee = _Tee(2, None)
        self._tees.append(tee)
        return io.TextIOWrapper(io.BufferedWriter(tee))

    def answered(self) -> None:
        """The caller has its answer: what the call's streams still hold goes nowhere."""
        for tee in self._tees:
            tee.drop()

    def exited(self, status: int) -> None:
        """The call ran, and its exit status goes to the caller now."""
        self._seconds = time.monotonic() - self._start
        self._result = "0" if status == 0 else self._error_code()

    def refused(self, code: int) -> None:
        """Nothing ran: the caller gets a refusal with ``code``."""
        self._seconds = time.monotonic() - self._start
        self._result = str(code)
        self.refusal = True

    def _error_code(self) -> str:
        """The code of the CNI error object the call wrote, as its caller reads it."""
        try:
            code = json.loads(self._out).get("code")
        except (ValueError, AttributeError):
            code = None
        return str(code) if isinstance(code, int) and 0 <= code < 1000 else "unknown"

    def claims_refused(self, count: int) -> None:
        """The VF claims the call found held by another call (measure.ClaimTimes)."""
        self._claims_refused = count

    def held(self, private: int) -> None:
        """The bytes the child alone holds after the call (budget.private_bytes)."""
        self._private = private

    def send(self, channel: socket.socket) -> None:
        message = {
            "result": self._result,
            "seconds": self._seconds,
            "claimsRefused": self._claims_refused,
            "privateBytes": self._private,
        }
        try:
            channel.send(json.dumps(message).encode())
        except OSError:
            pass  # the daemon is gone: nobody counts any more


@dataclass(frozen=True)
class Reported:
    """A child's :class:`Report` of one call, as the daemon read it."""

    # The CNI error code the caller got ("0": success, "unknown": unreadable).
    result: str
    seconds: float
    claims_refused: int
    # What the child alone held after the call: the daemon's cap follows the most.
    private_bytes: int


def _become_caller(call: intake.Call, report: Report) -> tuple[str, Program, dict[str, str]]:
    """Take over the caller's descriptors and directory; its environment is returned.

    The environment is not copied into this process's: the program runs on
    the mapping, and passes it to the IPAM plugin it executes.  The C
    library sets and unsets variables one at a time, each by a search of
    the whole environment, so copying a caller's 100 000 entries in (and
    clearing them for the next call) took minutes.
    """
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
    sys.stdin = open(0, closefd=False)
    sys.stdout = report.stdout()
    sys.stderr = report.stderr()
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


def serve_one(call: intake.Call, options: Options, watchdog: Watchdog, null: int, name: str) -> Report:
    """Runs in a child, from the call handed over to the answer; what to tell the daemon of it.

    ``null``: what the caller's descriptors become once answered; ``name``:
    the call's in the measurements.  The child may serve another call, but
    not after a refusal (:attr:`Report.refusal`).
    """
    report = Report()
    conn = call.conn
    program, run, env = _become_caller(call, report)

    def reply(code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:
                pass  # the caller closed its end: the call ran all the same
        report.answered()
        watchdog.answered.set()
        report.exited(code)
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
        stdin = _read_stdin(options.request_timeout)
    except OSError as exc:
        refusal = CNIError(Code.IO_FAILURE, f"cannot read the caller's stdin: {exc.strerror}; nothing ran")
    except CNIError as exc:
        refusal = exc
    else:
        # The store the call opens times its claims: the refused ones are a
        # metric, and a measured call writes them all.
        claims = ClaimTimes()
        host = Host(options.paths, claims.store)

        def run_call() -> int:
            return run(env, stdin, sys.stdout, sys.stderr, host)

        if options.measure is None:
            reply(run_call())
        else:
            about = {
                "program": program,
                "command": env.get("CNI_COMMAND", ""),
                "container": env.get("CNI_CONTAINERID", ""),
                "claims": claims.times,
            }
            run_measured(options.measure, name, run_call, reply, about)
        report.claims_refused(claims.refused())
        return report
    # Nothing has run: the shim prints the reason, the Python client runs
    # the call itself.
    watchdog.answered.set()
    report.refused(refusal.code)
    conn.settimeout(options.request_timeout)
    conn.sendall(intake.refusal_frame(refusal))
    return report


def spare(ours: socket.socket, daemon: int, messages: int, options: Options) -> None:
    """Runs in a forked child: serves the calls the daemon hands it, one at a time, until it ends.

    The daemon keeps such children forked ahead of the calls, so a call
    does not wait for the fork of the daemon (a copy of every page table of
    a 40 MiB interpreter), nor for its watchdog thread to start.  The child
    tells the daemon (pid ``daemon``) on its ``messages`` pipe each time it
    waits for a call (see options.CALLS_PER_CHILD); the daemon hands it one
    on its channel, ``ours``, or closes the channel to end it
    (options.CHILD_IDLE).
    """
    idle_group = os.getpgid(0)
    # What the caller's descriptors become once a call has answered: they
    # must be released (its runtime reads to EOF) and 0-2 must stay taken,
    # or the next call's descriptors would land on one of them.
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for served in range(options.calls_per_child):
        # An idle child ends with the daemon, as its channel does.
        lifetime.die_with_parent(daemon)
        if served:
            os.setpgid(0, idle_group)
        watchdog = Watchdog()
        say_ready(messages)
        call = take_over(ours)
        if call is None:
            return
        # Taken: a call runs to its end even when the daemon is restarted
        # meanwhile, as an executed plugin would.
        lifetime.outlive_parent()
        # The call's group: what it starts (delegated IPAM, helpers in a pod's
        # namespace) ends with it (Watchdog).
        os.setpgid(0, 0)
        with call.conn:
            report = serve_one(call, options, watchdog, null, f"{os.getpid()}-{served}")
        # After the answer, and before this child says it waits again: the
        # daemon reads it then (Children.on_messages), counts the call and
        # sizes its cap by what its children hold (Children.held).
        report.held(budget.private_bytes())
        report.send(ours)
        if report.refusal:
            return
