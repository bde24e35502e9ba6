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
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sriov_cni import safepath
from sriov_cni.daemon import budget
from sriov_cni.daemon.programs import Program
from sriov_cni.paths import Paths

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


@contextmanager
def timed_claims() -> Iterator[list[tuple[float, bool]]]:
    """Each VF claim tried meanwhile: the seconds it took, and whether it got the claim.

    How long calls wait for each other's VFs, and how often an ADD passes a
    VF over because another call holds it, can so be checked on a node.
    The store's claim is wrapped while a daemon child runs a call (the
    refused claims are a metric; a measured call keeps the times too): the
    store itself knows nothing of measuring.  A call's first claim also counts the
    check of the store's directories.
    """
    from sriov_cni.vfstore import Claim, FileStore

    times: list[tuple[float, bool]] = []
    claim = FileStore.claim

    def timed(self: FileStore, vf_pci: str, wait: float = 0.0) -> Claim | None:
        asked = time.perf_counter()
        got = claim(self, vf_pci, wait)
        times.append((time.perf_counter() - asked, got is not None))
        return got

    FileStore.claim = timed  # type: ignore[method-assign]
    try:
        yield times
    finally:
        FileStore.claim = claim  # type: ignore[method-assign]


def run_measured(
    program: str,
    run: Program,
    env: dict[str, str],
    stdin: bytes,
    paths: Paths,
    measure: Measure,
    name: str,
    reply: Callable[[int], None],
    claims: list[tuple[float, bool]],
) -> None:
    """Run the call as :func:`call.serve_one` does, and write what it cost; ``claims`` fills as it runs."""
    import cProfile
    import resource

    profiler = cProfile.Profile() if measure.profile else None
    start, cpu_start = time.perf_counter(), time.process_time()
    if profiler is not None:
        code = profiler.runcall(run, env, stdin, sys.stdout, sys.stderr, paths)
    else:
        code = run(env, stdin, sys.stdout, sys.stderr, paths)
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
        "private_kib": budget.private_bytes() // 1024,
        "claims": claims,
    }
    # A reader sees a whole file or none; a measurement, not state, so not
    # synced: an fsync per call would weigh on the figures it is read for.
    safepath.replace_file(base + ".json", json.dumps(stats).encode(), 0o644, sync=False)
