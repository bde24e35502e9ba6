"""Measuring what each call costs, for a node's figures and the benchmarks.

The daemon started with ``SRIOV_CNI_DAEMON_STATS`` set to a directory makes
each child write there, after answering, what its call cost:
``<pid>-<n>.json`` for its n-th call (from 0), with the program, the CNI
command, the seconds it ran and the CPU seconds it used, the child's peak
memory (over its calls so far) and private memory, and each VF claim it
tried (seconds taken, whether it got the claim).  With
``SRIOV_CNI_DAEMON_PROFILE=1`` as well, the call runs under cProfile and
``<pid>-<n>.prof`` holds the dump (tests/bench/bench_plugin.py reads both).
Unset, nothing is measured.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sriov_cni import safepath
from sriov_cni.daemon import budget
from sriov_cni.vfstore import Claim, FileStore, Store

STATS_ENV = "SRIOV_CNI_DAEMON_STATS"
PROFILE_ENV = "SRIOV_CNI_DAEMON_PROFILE"


@dataclass(frozen=True)
class Measure:
    """Where each child writes what its call cost, and whether under cProfile."""

    directory: str
    profile: bool

    @classmethod
    def from_env(cls) -> Measure | None:
        directory = os.environ.get(STATS_ENV)
        return cls(directory, os.environ.get(PROFILE_ENV) == "1") if directory else None


class TimedStore(FileStore):
    """The VF store a daemon child's call gets: each claim it tries is timed, and whether it got it.

    How long calls wait for each other's VFs, and how often an ADD passes a
    VF over because another call holds it, can so be checked on a node: the
    refused claims are a metric, and a measured call keeps the times too.
    The store itself knows nothing of measuring.  A call's first claim also
    counts the check of the store's directories.
    """

    def __init__(self, data_dir: str, times: list[tuple[float, bool]]) -> None:
        super().__init__(data_dir)
        self._times = times

    def claim(self, vf_pci: str, wait: float = 0.0) -> Claim | None:
        asked = time.perf_counter()
        got = super().claim(vf_pci, wait)
        self._times.append((time.perf_counter() - asked, got is not None))
        return got


class ClaimTimes:
    """Every VF claim one call tried, through the stores :meth:`store` opened for it: (seconds, got it)."""

    def __init__(self) -> None:
        self.times: list[tuple[float, bool]] = []

    def store(self, data_dir: str) -> Store:
        """The store in ``data_dir``, as :class:`commands.Deps` opens one, its claims timed here."""
        return TimedStore(data_dir, self.times)

    def refused(self) -> int:
        return sum(1 for _, got in self.times if not got)


def run_measured(
    measure: Measure, name: str, run: Callable[[], int], reply: Callable[[int], None], about: Mapping[str, object]
) -> None:
    """Run the call as :func:`child.serve_one` does, and write what it cost to ``name`` in the directory.

    ``about``: the call's program, command and container, and its claims
    (a list that fills as it runs), written with its costs.
    """
    import cProfile
    import resource

    profiler = cProfile.Profile() if measure.profile else None
    start, cpu_start = time.perf_counter(), time.process_time()
    code = run() if profiler is None else profiler.runcall(run)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    reply(code)  # closes the caller's stdout before the statistics are gathered
    base = os.path.join(measure.directory, name)
    if profiler is not None:
        profiler.dump_stats(base + ".prof")
    stats = {
        **about,
        "status": code,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "private_kib": budget.private_bytes() // 1024,
    }
    # A reader sees a whole file or none; a measurement, not state, so not
    # synced: an fsync per call would weigh on the figures it is read for.
    safepath.replace_file(base + ".json", json.dumps(stats).encode(), 0o644, sync=False)
