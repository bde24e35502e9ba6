"""The daemon's children: forked ahead of the calls, each serving calls in turn.

The daemon side (:class:`Children`) forks spares, hands each call to a
waiting child, spaces out forks while children end at start, and ends
children that stayed idle.  The child side (:func:`spare`) waits for a call
on its channel, serves it (:mod:`call`) and waits again.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from sriov_cni.cni import CNIError, Code
from sriov_cni.daemon import budget, channel, intake
from sriov_cni.daemon.call import serve_one
from sriov_cni.daemon.metrics import Metrics
from sriov_cni.daemon.options import Options
from sriov_cni.daemon.watchdog import Watchdog
from sriov_cni.kernel import lifetime

# Children forked ahead, each waiting to take the next call.  Two, so that
# a second call arriving at once need not wait for its fork either.
SPARES = 2
# Seconds before forking again after a child ended at start, doubled for
# each such end in a row, up to the maximum.
START_BACKOFF = 0.5
START_BACKOFF_MAX = 30.0


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
        channel.say_ready(messages)
        call = channel.take_over(ours)
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


class Children:
    """The daemon's children: each starting, waiting for a call, or running one."""

    def __init__(self, admitted: budget.Admission, options: Options, metrics: Metrics) -> None:
        self.admitted = admitted
        self.options = options
        self.metrics = metrics
        self.daemon = os.getpid()
        self.max = admitted.children
        # The most a child has held after a call (0: none has reported yet).
        self.child_bytes = 0
        self.idle = options.child_idle
        # The daemon's end of each child's channel (channel.hand_over).
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

    def fork(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            status = 1
            try:
                budget.expose_child()
                self._in_child(theirs)
                spare(theirs, self.daemon, self.messages_w, self.options)
                status = 0
            finally:  # the child must always reach _exit
                os._exit(status)
        theirs.close()
        self.channels[pid] = ours
        self.starting.add(pid)
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
                channel.hand_over(self.channels[pid], call)
            except OSError:
                continue  # it ended meanwhile; reaped with the next SIGCHLD
            self.served.add(pid)
            self.metrics.handed(pid, call.body)
            return True
        return False

    def on_messages(self) -> None:
        now = time.monotonic()
        for pid in channel.ready_pids(self.messages_r):
            # A pid not found was reaped already.
            if pid in self.channels:
                # The call it served, if any, reported before it said so.
                for report in channel.reports(self.channels[pid]):
                    self.metrics.reported(pid, report)
                    self.held(report.private_bytes)
                if pid in self.starting:
                    self.starting.remove(pid)
                    self.failures = 0
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
        if self.failures and self.starting:
            return False  # one at a time, until one starts
        return self.spares() < SPARES and len(self.channels) < self.max and now >= self.next_fork

    def reap(self) -> None:
        while self.channels:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            # Its last report, if it sent one before it ended, counts.
            for report in channel.reports(self.channels[pid]):
                self.metrics.reported(pid, report)
            self.metrics.ended(pid, pid in self.starting)
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
        sys.stderr.write(
            f"sriov-cni daemon: a child ended before it could take calls ({self.failure}, "
            f"{self.failures} in a row); the next fork in {delay:g} s\n"
        )
        sys.stderr.flush()

    def cannot_start(self) -> CNIError | None:
        """Why calls cannot run now: children end at start and none waits."""
        if not self.failures or self.waiting:
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
