"""Serving one call in a child: becoming its caller, reading its stdin, running it, answering.

A child forked from the daemon (:mod:`childpool`) is handed a complete, checked
request (:class:`intake.Call`).  It takes the caller's descriptors,
environment and working directory over and runs the program the caller
named (:mod:`programs`); the exit status goes back in the answer frame
(:mod:`wire`).
"""

from __future__ import annotations

import math
import os
import select
import socket
import sys
import time

from sriov_cni.cni import MAX_CONFIG, CNIError, Code
from sriov_cni.daemon import intake, wire
from sriov_cni.daemon.channel import Report
from sriov_cni.daemon.measure import ClaimTimes, run_measured
from sriov_cni.daemon.options import Options
from sriov_cni.daemon.programs import PROGRAMS, Host, Program
from sriov_cni.daemon.watchdog import Watchdog


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
