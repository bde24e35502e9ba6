"""What ``sriov-cni daemon`` is started with: one frozen value, built once by the command line.

The server, its children and the metrics read the options they need from
it; none is passed on loose.  A module of its own, importing no part of the
daemon's machinery: the command line shows the defaults in its options,
and importing :mod:`server` for them would load the whole daemon (pyroute2,
prometheus_client) into every ``sriov-cni`` run, the readiness probe's
every 20 s among them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sriov_cni.daemon.client import DEFAULT_SOCKET
from sriov_cni.daemon.measure import Measure
from sriov_cni.kernel.vfsettings import VfStatsReader
from sriov_cni.paths import Paths
from sriov_cni.vfstore import DEFAULT_DATA_DIR

# Seconds a caller has to send its request, and then to end its stdin: one
# that sends nothing (or half a request) must not hold a connection slot,
# nor a child, forever.
REQUEST_TIMEOUT = 10.0
# Each child is a forked copy of the daemon; calls beyond this wait in the
# daemon until one ends, so a flood cannot exhaust the node's memory.
# The daemon's memory budget lowers it further (budget.admission).
MAX_CHILDREN = 64
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
# Seconds a stopping daemon (SIGTERM) waits for the calls it runs to end
# (--drain-timeout); the DaemonSet's terminationGracePeriodSeconds is above.
DRAIN_TIMEOUT = 20.0
# Where containerd 2.x and CRI-O listen for NRI plugins (NRI's default).
NRI_SOCKET = "/var/run/nri/nri.sock"


@dataclass(frozen=True)
class Options:
    """The daemon's options, each the default when not given (see ``sriov-cni daemon --help``)."""

    socket: str = DEFAULT_SOCKET
    request_timeout: float = REQUEST_TIMEOUT
    max_children: int = MAX_CHILDREN
    child_idle: float = CHILD_IDLE
    calls_per_child: int = CALLS_PER_CHILD
    # Bytes the daemon and its children may hold, instead of its cgroup's limit.
    memory_budget: int | None = None
    drain_timeout: float = DRAIN_TIMEOUT
    # Where to serve Prometheus metrics (exporter), None: not served.
    metrics_address: tuple[str, int] | None = None
    # The store whose pool the metrics show.
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    # Where the calls and the metrics find the node.
    paths: Paths = field(default_factory=Paths)
    # The runtime's NRI socket the daemon's NRI plugin connects to whenever
    # it exists (daemon.nri); None: no NRI plugin.
    nri_socket: str | None = NRI_SOCKET
    # Whether the daemon gives back the VFs of pods that died without a DEL
    # (daemon.heal), from the store at data_dir.
    heal: bool = True
    # What each child records of its calls (SRIOV_CNI_DAEMON_STATS), None: nothing.
    measure: Measure | None = None
    # Where the metrics read the attachments' VF counters, None: the PFs'
    # (KernelVfStats); tests without SR-IOV hardware give their own.
    vf_stats: Callable[[], VfStatsReader] | None = None
