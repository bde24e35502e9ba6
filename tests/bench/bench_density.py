#!/usr/bin/env python3
"""Pod starts arriving at a steady rate, as kube-burner's node-density-cni sends them: each ADD's latency.

The shape Multus gates its changes on: 64 pods on one node, arriving 10 a
second, each with a secondary network; then their deletions at the same
rate.  The node is the host test fixtures (tests/support/hostnode.py): 64
veth ends as VFs in a temporary sysfs, the real daemon behind the static
shim, in a memory cgroup limited as the DaemonSet limits it.  Each call is
started at its arrival time, whatever the calls before it are doing, and
its latency is from then until the shim exits: what a DRA driver's NRI
hook waits for (containerd's request timeout is 2 s by default).

Runs, back to back and in turn (``--repeats``), each on a fresh daemon in a
fresh cgroup: ``sriov`` taking a VF from the pool with host-local IPAM (the
Go executable, as the peer runs it), ``sriov`` with sriov-ipam in process,
and the peer, Go ``host-device`` moving VF netdev i into pod i with
host-local, through the same arrivals.

Printed per run: ADD and DEL latency p50, p99 and max (p99 of 64 calls
interpolated between the two slowest), failed calls, OOM kills and the
cgroup's peak.  For ``sriov``, each call's latency is split, from the
daemon's per-call statistics (SRIOV_CNI_DAEMON_STATS), into the time the
plugin ran in a daemon child and the rest (the shim, the socket, waiting
for a child the memory budget admits): what sets the tail is printed from
that split for the slowest calls (with ``--profile``, their time by phase;
the calls then run under cProfile, which slows them), with the most ADDs
that were under way at once and how many the daemon admits.  Asserts
nothing; exits non-zero only when the fixtures cannot be built.

    python3 tests/bench/bench_density.py
    python3 tests/bench/bench_density.py --repeats 3 --rate 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import budget, measure  # noqa: E402
from tests.bench import phases  # noqa: E402
from tests.bench.bench_burst import DAEMONSET_LIMIT, MiB  # noqa: E402
from tests.support.daemonlib import Daemon  # noqa: E402
from tests.support.hostnode import HostNode, bench_node  # noqa: E402
from tests.support.memcg import MemoryCgroup  # noqa: E402

PODS = 64
RATE = 10.0
PEER = "host-device (Go), host-local"
RUNS = ("sriov, shim + daemon, host-local", "sriov, shim + daemon, sriov-ipam", PEER)


@dataclass
class Calls:
    """One command's calls of a run: latency per pod, and what failed."""

    latency: dict[int, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Served:
    """An ADD in its daemon child: seconds it ran, CPU seconds it used, whether it was the child's first call.

    ``phases``: where its time went (tests/bench/phases.py), when profiled.
    """

    seconds: float
    cpu_seconds: float
    first: bool
    phases: dict[str, float]


@dataclass
class Run:
    name: str
    adds: Calls
    dels: Calls
    peak: int
    oom_kills: int
    # Each sriov ADD as its daemon child measured it, by pod; empty for the peer.
    ran: dict[int, Served]
    # The daemon's banner: how many calls at once its memory budget admits.
    admitted: str
    rate: float

    def in_flight(self) -> int:
        """The most ADDs under way at once: pod i's from i / rate for its latency."""
        edges = sorted(
            [(i / self.rate, 1) for i in self.adds.latency]
            + [(i / self.rate + t, -1) for i, t in self.adds.latency.items()]
        )
        most = now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def arrivals(rate: float, start: Any) -> Calls:
    """Every pod's call started at its arrival time, ``i / rate`` s after the first; waited for."""
    calls = Calls()
    lock = threading.Lock()

    def one(i: int) -> None:
        t0 = time.perf_counter()
        proc = start(i)
        out, err = proc.communicate()
        elapsed = time.perf_counter() - t0
        with lock:
            calls.latency[i] = elapsed
            if proc.returncode != 0:
                calls.errors.append(f"pod {i}: {out.decode().strip()} {err.decode().strip()[-300:]}")

    threads = []
    first = time.perf_counter()
    for i in range(PODS):
        delay = first + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(i,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return calls


def run_once(
    name: str, node: HostNode, work: Path, bindir: Path, pods: list[str], rate: float, limit: int, profile: bool
) -> Run:
    tag = uuid.uuid4().hex[:6]
    ipam_dir = work / f"ipam-{tag}"
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_PATH": str(bindir), "CNI_IFNAME": "net1"}
    peer = name == PEER
    cgroup = MemoryCgroup(None if peer else limit, "sriov-cni-density")
    daemon: Daemon | None = None
    admitted = ""
    stats = work / f"stats-{tag}"
    if peer:
        exe = bindir / "host-device"
        vfs = [vf.netdev for vf in node.node.pfs[0].vfs]

        def conf(i: int) -> bytes:
            ipam = {"type": "host-local", "subnet": "10.97.0.0/24", "dataDir": str(ipam_dir)}
            body = {"cniVersion": "1.0.0", "name": "density", "type": "host-device", "device": vfs[i], "ipam": ipam}
            return json.dumps(body).encode()

        env = dict(base)
    else:
        stats.mkdir()
        sock_dir = work / f"run-{tag}"
        daemon = Daemon(
            sock_dir,
            program=node.daemon_command,
            wrapper=cgroup.wrap([]),
            env={"PYTHONPATH": str(ROOT), measure.STATS_ENV: str(stats), measure.PROFILE_ENV: "1" if profile else ""},
        )
        admitted = daemon.banner.partition(", ")[2].partition(" (")[0]
        exe = bindir / "sriov"
        ipam_type = "sriov-ipam" if name.endswith("sriov-ipam") else "host-local"
        body = {
            "cniVersion": "1.0.0",
            "name": "density",
            "type": "sriov",
            "pfNames": [pf.name for pf in node.node.pfs],
            "dataDir": str(work / f"state-{tag}"),
            "ipam": {"type": ipam_type, "subnet": "10.97.0.0/24", "dataDir": str(ipam_dir)},
        }

        def conf(i: int) -> bytes:
            return json.dumps(body).encode()

        env = dict(base, SRIOV_CNI_SOCKET=str(daemon.socket))

    def starter(command: str) -> Any:
        def start(i: int) -> subprocess.Popen[bytes]:
            call_env = dict(env, CNI_COMMAND=command, CNI_CONTAINERID=f"density{i}", CNI_NETNS=pods[i])
            proc = subprocess.Popen(
                [str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=call_env
            )
            assert proc.stdin is not None
            proc.stdin.write(conf(i))
            proc.stdin.close()
            proc.stdin = None
            return proc

        return start

    try:
        adds = arrivals(rate, starter("ADD"))
        dels = arrivals(rate, starter("DEL"))
        peak, kills = cgroup.peak(), cgroup.oom_kills()
    finally:
        if daemon is not None:
            daemon.stop()
        cgroup.remove()
    ran: dict[int, Served] = {}
    if not peer:
        # <pid>-<n>.json: the child's n-th call, from 0.
        for report in stats.glob("*.json"):
            entry = json.loads(report.read_text())
            if entry["program"] == "sriov" and entry["command"] == "ADD":
                first = report.stem.endswith("-0")
                prof = report.with_suffix(".prof")
                shares = phases.breakdown(prof)[0] if prof.exists() else {}
                served = Served(entry["seconds"], entry["cpu_seconds"], first, shares)
                ran[int(entry["container"].removeprefix("density"))] = served
    return Run(name, adds, dels, peak, kills, ran, admitted, rate)


def figures(calls: Calls) -> str:
    values = list(calls.latency.values())
    return f"{statistics.median(values):6.3f} {quantile(values, 0.99):6.3f} {max(values):6.3f}"


def tail(run: Run) -> str:
    """Of the five slowest ADDs: how long the plugin ran and on CPU, and how long the call waited besides."""
    slowest = [i for i in sorted(run.adds.latency, key=run.adds.latency.__getitem__)[-5:] if i in run.ran]
    if not slowest:
        return f"    {run.name}: no statistics from the daemon"
    ran = [run.ran[i] for i in slowest]
    waited = [run.adds.latency[i] - r.seconds for i, r in zip(slowest, ran, strict=True)]
    every = list(run.ran.values())
    return (
        f"    {run.name}: the {len(slowest)} slowest ADDs ran {statistics.mean(r.seconds for r in ran):.3f} s "
        f"in a daemon child, {statistics.mean(r.cpu_seconds for r in ran):.3f} s of it on CPU "
        f"({sum(r.first for r in ran)} of them a child's first call), and spent "
        f"{statistics.mean(waited):.3f} s besides (shim, socket, waiting for a child); every ADD: median "
        f"{statistics.median(r.seconds for r in every):.3f} s run, "
        f"{statistics.median(r.cpu_seconds for r in every):.3f} s CPU, "
        f"{sum(r.first for r in every)} of {len(every)} a child's first call; at most {run.in_flight()} ADDs "
        f"in flight, the daemon admitting {run.admitted}"
    ) + "".join(_phases(ran))


def _phases(ran: list[Served]) -> list[str]:
    """Where the slowest ADDs' time went in their children, averaged over them, largest first (when profiled)."""
    total: dict[str, float] = {}
    for served in ran:
        for phase, seconds in served.phases.items():
            total[phase] = total.get(phase, 0.0) + seconds / len(ran)
    return [f"\n      {phase:42} {seconds:6.3f} s" for phase, seconds in sorted(total.items(), key=lambda kv: -kv[1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=RATE, help=f"pods arriving per second (default {RATE:g})")
    parser.add_argument("--limit", default=DAEMONSET_LIMIT, help=f"the daemon's cgroup limit ({DAEMONSET_LIMIT})")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the three runs, in turn")
    parser.add_argument(
        "--profile", action="store_true", help="profile each call in the daemon's children; the slowest ADDs by phase"
    )
    args = parser.parse_args()
    limit = budget.parse_size(args.limit)
    runs: list[Run] = []
    lines: list[str] = []
    with bench_node("density", PODS, ("host-local", "host-device")) as bench:
        head = (
            f"{PODS} pods arriving {args.rate:g}/s, then deleted at the same rate; {PODS} veth VFs, one PF; "
            f"the daemon's cgroup: {limit / MiB:.0f} MiB; {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at the start"
        )
        columns = (
            f"{'run':>34} {'ADD p50':>7} {'p99':>6} {'max':>6} {'DEL p50':>7} {'p99':>6} {'max':>6} "
            f"{'failed':>6} {'OOM kills':>9} {'peak MiB':>8}"
        )
        print(head, columns, sep="\n", flush=True)
        lines += [head, columns]
        for _ in range(args.repeats):
            for name in RUNS:
                run = run_once(name, bench.node, bench.work, bench.bindir, bench.pods, args.rate, limit, args.profile)
                runs.append(run)
                line = (
                    f"{name:>34} {figures(run.adds)} {figures(run.dels)} "
                    f"{len(run.adds.errors) + len(run.dels.errors):>6} {run.oom_kills:>9} "
                    f"{'-' if name == PEER else f'{run.peak / MiB:.1f}':>8}"
                )
                print(line, flush=True)
                lines.append(line)
                for error in (run.adds.errors + run.dels.errors)[:3]:
                    print(f"    {error}", flush=True)
        peer = [run for run in runs if run.name == PEER]
        for name in RUNS[:2]:
            ours = [run for run in runs if run.name == name]
            p99 = statistics.median(quantile(list(r.adds.latency.values()), 0.99) for r in ours)
            go = statistics.median(quantile(list(r.adds.latency.values()), 0.99) for r in peer)
            line = f"ADD p99, {name} / {PEER}: {p99 / go:.2f}"
            lines += [line, tail(ours[-1])]
        lines.append(f"    {PEER}: at most {peer[-1].in_flight()} ADDs in flight")
        lines.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("\n".join(["", "==== summary", *lines]))


if __name__ == "__main__":
    main()
