"""A forked process: its life tied to its parent's (PR_SET_PDEATHSIG), and what it keeps of the parent's."""

from __future__ import annotations

import os
import signal

from sriov_cni.kernel.libc import libc

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def load() -> None:
    """Load libc now: a forked child about to exec must not need to."""
    libc()


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` (its parent now) ends."""
    libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it ended before the signal was armed
        os._exit(1)


def set_name(name: str) -> None:
    """Name this process (its ``comm``, at most 15 bytes), for ps and top to tell it from its parent's copies."""
    libc().prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def outlive_parent() -> None:
    """Undo :func:`die_with_parent`."""
    libc().prctl(_PR_SET_PDEATHSIG, 0)


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but ``keep``."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the directory's own descriptor, closed by now


def leave_daemon(keep: set[int]) -> None:
    """In a process just forked from the daemon's loop: keep nothing of it but the descriptors ``keep``.

    The loop's signal handling first: its SIGCHLD and SIGTERM handlers would
    keep this process from ending on SIGTERM, and its wakeup descriptor,
    once closed here, might be a descriptor reused for something else.
    """
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    close_all_but(keep)


class Backoff:
    """Seconds to wait before starting a process again after one ended early: doubled for each in a row, up to ``most``.

    Starting again at once, forever, would turn a broken install (a child
    that cannot import) or a taken port (an exporter that cannot listen)
    into a fork loop on every core.
    """

    def __init__(self, first: float, most: float) -> None:
        self.first = first
        self.most = most
        # Early ends since a process last lasted (reset()).
        self.in_a_row = 0

    def ended(self) -> float:
        """One more ended early: the seconds to wait before the next start."""
        delay = min(self.first * 2.0**self.in_a_row, self.most)
        self.in_a_row += 1
        return delay

    def reset(self) -> None:
        """A process lasted: the next that ends early waits ``first`` again."""
        self.in_a_row = 0
