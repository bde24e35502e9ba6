"""What a test's child processes start with: the test's choice, not whatever the suite's caller had.

A child inherits its parent's ignored signals across exec, and a suite run
under ``nohup`` (SIGHUP ignored) or from a non-interactive shell's ``&``
(SIGINT and SIGQUIT ignored) passes those on to every process a test
starts; a shell stand-in cannot even trap a signal it started with ignored.
Likewise a variable the product reads, left in the caller's environment,
would steer the daemons, shims and plugins the tests run.
"""

from __future__ import annotations

import signal
from collections.abc import MutableMapping

# The signals a stand-in traps or a test sends, which a caller may have
# ignored.
TEST_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def default_signals() -> None:
    """A ``preexec_fn``: the child starts with the test signals at their defaults."""
    for sig in TEST_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def is_caller_setting(name: str) -> bool:
    """A variable of the caller's that the product reads: the CNI call's, the daemon's socket and its statistics.

    The guest's markers (SRIOV_CNI_VM, SRIOV_CNI_VM_*) are the rig's, meant
    for the suite, and stay.
    """
    return name.startswith("CNI_") or (name.startswith("SRIOV_CNI_") and not name.startswith("SRIOV_CNI_VM"))


def drop_caller_settings(env: MutableMapping[str, str]) -> list[str]:
    """Removes the caller's settings (see :func:`is_caller_setting`) from ``env``; returns their names."""
    dropped = sorted(name for name in env if is_caller_setting(name))
    for name in dropped:
        del env[name]
    return dropped


def ignored_signals(pid: int) -> set[signal.Signals]:
    """The signals ``pid`` ignores, as the kernel reports them (``SigIgn`` in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return {s for s in signal.Signals if mask >> (s - 1) & 1}
