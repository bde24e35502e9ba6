"""The daemon's children, from the daemon's side: forked ahead of the calls, each serving calls in turn.

:class:`Children` forks spares, hands each call to a waiting child, reads
their reports, spaces out forks while children end at start, and ends
children that stayed idle.  What a child runs, and what it and the daemon
say to each other, is :mod:`child`'s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator

from sriov_cni.cni import CNIError, Code
from sriov_cni.daemon import budget, child, intake
from sriov_cni.daemon.metrics import Metrics
from sriov_cni.daemon.options import Options
from sriov_cni.kernel import lifetime

# Children forked ahead, each waiting to take the next call.  Two, so that
# a second call arriving at once need not wait for its fork either.
SPARES = 2
# Seconds before forking again after a child ended at start, doubled for
# each such end in a row, up to the maximum.
START_BACKOFF = 0.5
START_BACKOFF_MAX = 30.0


def ready_pids(messages: int) -> list[int]:
    """In the daemon: the children that said they wait for a call since it last read ``messages``."""
    data = os.read(messages, child.READY.size * 64)
    return [pid for (pid,) in child.READY.iter_unpack(data)]


# The hand-over: one message carrying the connection, the caller's three
# descriptors and a memfd holding the request body (up to MAX_REQUEST, more
# than a datagram holds).


def hand_over(channel: socket.socket, call: intake.Call) -> None:
    """Send ``call`` to the child at the other end of ``channel``, and close it here.

    Raises OSError, with ``call`` still open, when the child is gone.
    """
    body = os.memfd_create("sriov-cni-request", os.MFD_CLOEXEC)
    try:
        with open(body, "wb", closefd=False) as f:
            f.write(call.body)
        socket.send_fds(channel, [b"c"], [call.conn.fileno(), *call.fds, body], socket.MSG_DONTWAIT)
    finally:
        os.close(body)
    call.close()


def reports(channel: socket.socket) -> Iterator[child.Reported]:
    """The reports a child sent on ``channel`` that the daemon has not read yet."""
    while True:
        try:
            message = channel.recv(4096, socket.MSG_DONTWAIT)
        except OSError:
            # Nothing more (EAGAIN), or closed here already: the daemon
            # closes the channel of a waiting child to end it, and such a
            # child has no call to report on.
            return
        if not message:
            return
        raw = json.loads(message)
        yield child.Reported(
            str(raw["result"]), float(raw["seconds"]), int(raw["claimsRefused"]), int(raw["privateBytes"])
        )


class Children:
    """The daemon's children: each starting, waiting for a call, or running one."""

    def __init__(self, admitted: budget.Admission, options: Options, metrics: Metrics | None) -> None:
        """``metrics``: None when they are not served."""
        self.admitted = admitted
        self.options = options
        self.metrics = metrics
        self.daemon = os.getpid()
        self.max = admitted.children
        # The most a child has held after a call (0: none has reported yet).
        self.child_bytes = 0
        self.idle = options.child_idle
        # The daemon's end of each child's channel (hand_over).
        self.channels: dict[int, socket.socket] = {}
        self.starting: set[int] = set()
        # Since when each waits; one that has served calls ends after ``idle``.
        self.waiting: dict[int, float] = {}
        self.served: set[int] = set()
        # Children that ended before they could wait for a call (a broken
        # install) since one last could: forks are spaced out meanwhile.
        self.backoff = lifetime.Backoff(START_BACKOFF, START_BACKOFF_MAX)
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

    def fork(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            status = 1
            try:
                budget.expose_child()
                self._in_child(theirs)
                child.spare(theirs, self.daemon, self.messages_w, self.options)
                status = 0
            finally:  # the child must always reach _exit
                os._exit(status)
        theirs.close()
        self.channels[pid] = ours
        self.starting.add(pid)
        if self.metrics is not None:
            self.metrics.forked()

    def _in_child(self, channel: socket.socket) -> None:
        """Keep nothing of the daemon's loop but this child's channel and the messages pipe.

        In particular no other caller's connection: a caller refused by
        the daemon reads its answer to the end of the connection, which
        does not come while a copy stays open here.
        """
        lifetime.leave_daemon({0, 1, 2, channel.fileno(), self.messages_w})

    def hand(self, call: intake.Call) -> bool:
        """Give ``call`` to a waiting child; False when none could take it."""
        while self.waiting:
            # The one that waited last: its pages are the warmest, and the
            # others may reach their idle end.
            pid = max(self.waiting, key=self.waiting.__getitem__)
            del self.waiting[pid]
            try:
                hand_over(self.channels[pid], call)
            except OSError:
                continue  # it ended meanwhile; reaped with the next SIGCHLD
            self.served.add(pid)
            if self.metrics is not None:
                self.metrics.handed(pid, call.body)
            return True
        return False

    def on_messages(self) -> None:
        now = time.monotonic()
        for pid in ready_pids(self.messages_r):
            # A pid not found was reaped already.
            if pid in self.channels:
                # The call it served, if any, reported before it said so.
                for report in reports(self.channels[pid]):
                    if self.metrics is not None:
                        self.metrics.reported(pid, report)
                    self.held(report.private_bytes)
                if pid in self.starting:
                    self.starting.remove(pid)
                    self.backoff.reset()
                self.waiting[pid] = now

    def held(self, child_bytes: int) -> None:
        """A child held ``child_bytes`` after a call: the cap follows the most any has held.

        Said once a child first reports, then whenever the cap changes.
        """
        if child_bytes <= self.child_bytes:
            return
        first, self.child_bytes = not self.child_bytes, child_bytes
        cap = self.admitted.children_at(child_bytes)
        if first or cap != self.max:
            self.max = cap
            sys.stderr.write(
                f"sriov-cni daemon: a call's child holds {child_bytes / budget.MiB:.1f} MiB: "
                f"at most {cap} call{'s' if cap > 1 else ''} at once\n"
            )
            sys.stderr.flush()

    def on_wake(self) -> None:
        while True:
            try:
                os.read(self.wake_r, 512)
            except BlockingIOError:
                break
        self.reap()

    def may_fork(self, now: float) -> bool:
        if self.backoff.in_a_row and self.starting:
            return False  # one at a time, until one starts
        return self.spares() < SPARES and len(self.channels) < self.max and now >= self.next_fork

    def reap(self) -> None:
        while self.channels:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            if self.metrics is not None:
                # Its last report, if it sent one before it ended, counts.
                for report in reports(self.channels[pid]):
                    self.metrics.reported(pid, report)
                self.metrics.ended(pid, pid in self.starting)
            self.channels.pop(pid).close()
            if pid in self.starting:
                self.starting.remove(pid)
                self._failed_at_start(status)
            self.waiting.pop(pid, None)
            self.served.discard(pid)

    def _failed_at_start(self, status: int) -> None:
        """A child ended before it could take a call: fork again only after a while (lifetime.Backoff)."""
        delay = self.backoff.ended()
        self.next_fork = time.monotonic() + delay
        if os.WIFSIGNALED(status):
            self.failure = f"killed by signal {os.WTERMSIG(status)}"
        else:
            self.failure = f"exit status {os.waitstatus_to_exitcode(status)}"
        # Once per interval: the next failure comes after the next fork.
        sys.stderr.write(
            f"sriov-cni daemon: a child ended before it could take calls ({self.failure}, "
            f"{self.backoff.in_a_row} in a row); the next fork in {delay:g} s\n"
        )
        sys.stderr.flush()

    def cannot_start(self) -> CNIError | None:
        """Why calls cannot run now: children end at start and none waits."""
        if not self.backoff.in_a_row or self.waiting:
            return None
        return CNIError(
            Code.TRY_AGAIN,
            f"the sriov-cni daemon's children end before they can take calls "
            f"({self.failure}; see the daemon's log), and it forks them again only "
            "after a while; nothing ran",
        )

    def next_retirement(self) -> float | None:
        times = [since + self.idle for pid, since in self.waiting.items() if pid in self.served]
        return min(times, default=None)

    def retire(self, now: float) -> None:
        """End the children that have served calls and waited ``idle`` since, giving back their pages.

        And waiting ones past a cap that fell (children hold more than
        assumed), the longest waiting first.
        """
        # Those ended here already keep their channel until reaped.
        excess = sum(1 for channel in self.channels.values() if channel.fileno() != -1) - self.max
        for pid, since in sorted(self.waiting.items(), key=lambda item: item[1]):
            if (pid in self.served and since + self.idle <= now) or excess > 0:
                excess -= 1
                del self.waiting[pid]
                self.channels[pid].close()  # the child reads the end of its channel and ends

    def end_waiting(self) -> None:
        for pid in list(self.waiting):
            del self.waiting[pid]
            self.channels[pid].close()

    def running(self) -> int:
        """Children running a call: neither starting, waiting, nor ending (their channel closed)."""
        return sum(
            1
            for pid, channel in self.channels.items()
            if channel.fileno() != -1 and pid not in self.starting and pid not in self.waiting
        )
