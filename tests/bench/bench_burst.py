#!/usr/bin/env python3
"""A burst of pod starts: N ADDs through the shim at once, then their N DELs, against one after another.

The node is the host test fixtures (tests/support/hostnode.py): 64 veth ends
as VFs in a temporary sysfs, one PF, the real daemon behind the static shim,
every ADD taking a VF from the pool (``pfNames``) with host-local IPAM, as a
runtime starting many pods of one network does.  The daemon runs in a memory
cgroup of its own limited as the DaemonSet limits it (``--limit``), so its
children and the IPAM plugins they run are charged there, as in the pod.

For each N, the same calls run one after another, then all at once, then all
at once in a cgroup without a limit (so the daemon admits up to its
--max-children, as it did before it read its budget), each through a fresh
daemon in a fresh cgroup, back to back, so that a shared machine's slow
spells fall on all three.  Printed per run: the seconds for the
ADDs and for the DELs, the peak of the cgroup (daemon + children + IPAM),
the OOM kills in it, the calls that failed, whether the daemon outlived the
run, and how many calls at once the daemon admitted (from its banner, and
once its children said what they hold, the cap it followed).
Beside them, the CPU seconds the cgroup used (the daemon, its children and
their IPAM) and those of the callers (the shims and this process starting
them), the cores all of that kept busy on average, and the cores the rest
of the machine kept busy meanwhile.  The last line for each N says what
that leaves a burst to gain: a burst of the same CPU time cannot take less
than that time spread over every core, and a burst that keeps fewer cores
busy than there are waits on something else.  What it waits on is measured
next, in the same run: every ADD moves its VF into the pod's namespace and
every DEL moves it back, and N such moves of spare veth ends (with ``ip``)
one after another and all at once show how much of that the kernel runs
one at a time (a move takes the kernel's one RTNL lock).
Asserts nothing; exits non-zero only when the fixtures cannot be built.

    python3 tests/bench/bench_burst.py                       # N = 8, 32, 64, limit 160Mi
    python3 tests/bench/bench_burst.py --sizes 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import budget  # noqa: E402
from tests.support.daemonlib import Daemon  # noqa: E402
from tests.support.hostnode import HostNode, bench_node  # noqa: E402
from tests.support.memcg import MemoryCgroup  # noqa: E402

VFS = 64
# The daemon container's limit in deploy/kubernetes/base/daemonset.yaml.
DAEMONSET_LIMIT = "160Mi"
MiB = 1 << 20
# (name, all at once, in the limited cgroup)
MODES = [("one by one", False, True), ("at once", True, True), ("at once, no limit", True, False)]


@dataclass
class Run:
    n: int
    add_s: float
    del_s: float
    peak: int
    oom_kills: int
    failed: int
    alive: bool
    admitted: str
    errors: list[str]
    cpu_s: float
    callers_cpu_s: float
    machine_busy_s: float

    @property
    def seconds(self) -> float:
        return self.add_s + self.del_s

    @property
    def ours(self) -> float:
        """Cores the calls kept busy, on average."""
        return (self.cpu_s + self.callers_cpu_s) / self.seconds

    @property
    def others(self) -> float:
        """Cores the rest of the machine kept busy meanwhile, on average."""
        return max(0.0, self.machine_busy_s / self.seconds - self.ours)


def callers_cpu_s() -> float:
    """CPU seconds of this process and of the children it waited for (the shims)."""
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def busy_cores_s() -> float:
    """Seconds the machine's cores spent busy since boot, all cores together (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def burst(node: HostNode, work: Path, shim: Path, pods: list[str], n: int, together: bool, limit: int | None) -> Run:
    """N ADDs then N DELs through a fresh daemon in a fresh cgroup."""
    cgroup = MemoryCgroup(limit, "sriov-cni-bench")
    sock = work / f"run-{uuid.uuid4().hex[:6]}" / "plugin.sock"
    daemon = Daemon(sock.parent, program=node.daemon_command, wrapper=cgroup.wrap([]), env={"PYTHONPATH": str(ROOT)})
    proc, banner = daemon.proc, daemon.banner.strip()
    conf = json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "burst",
            "type": "sriov",
            "pfNames": [pf.name for pf in node.node.pfs],
            "dataDir": str(work / "state"),
            "ipam": {"type": "host-local", "subnet": "10.96.0.0/24", "dataDir": str(work / "ipam")},
        }
    ).encode()
    errors: list[str] = []

    def env(i: int, command: str) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"burst{i}",
            "CNI_NETNS": pods[i],
            "CNI_IFNAME": "net1",
            "CNI_PATH": str(shim.parent),
            "SRIOV_CNI_SOCKET": str(sock),
        }

    def call(i: int, command: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [str(shim)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(i, command)
        )
        assert p.stdin is not None
        p.stdin.write(conf)
        p.stdin.close()
        p.stdin = None
        return p

    def done(p: subprocess.Popen[bytes], what: str) -> None:
        out, err = p.communicate()
        if p.returncode != 0:
            errors.append(f"{what}: {out.decode().strip()} {err.decode().strip()[-300:]}")

    def phase(command: str) -> float:
        t0 = time.perf_counter()
        if together:
            procs = [call(i, command) for i in range(n)]
            for i, p in enumerate(procs):
                done(p, f"{command} {i}")
        else:
            for i in range(n):
                done(call(i, command), f"{command} {i}")
        return time.perf_counter() - t0

    try:
        busy, cpu_start, callers_start = busy_cores_s(), cgroup.cpu_seconds(), callers_cpu_s()
        add_s = phase("ADD")
        del_s = phase("DEL")
        machine_busy, callers = busy_cores_s() - busy, callers_cpu_s() - callers_start
        alive = proc.poll() is None
        peak, kills, cpu = cgroup.peak(), cgroup.oom_kills(), cgroup.cpu_seconds() - cpu_start
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
        # The cap the daemon followed once its children said what they hold.
        assert proc.stderr is not None
        followed = [line.partition("holds ")[2] for line in proc.stderr.read().splitlines() if " holds " in line]
        daemon.stop()
        cgroup.remove()
    admitted = banner.partition(", ")[2].partition(" (")[0]
    if followed:
        admitted += f"; then, a child holding {followed[-1]}"
    return Run(n, add_s, del_s, peak, kills, len(errors), alive, admitted, errors, cpu, callers, machine_busy)


def namespace_moves(pods: list[str], together: bool) -> float:
    """Seconds for a veth end moved into each of ``pods`` and back, with ``ip``, at once or one by one."""
    token = uuid.uuid4().hex[:5]
    ends = [f"bm{token}{i}" for i in range(len(pods))]
    for end in ends:
        subprocess.run(["ip", "link", "add", end, "type", "veth", "peer", "name", end + "p"], check=True)
    there = [["ip", "link", "set", end, "netns", pod] for end, pod in zip(ends, pods, strict=True)]
    back = [["ip", "-n", pod, "link", "set", end, "netns", "1"] for end, pod in zip(ends, pods, strict=True)]
    try:
        t0 = time.perf_counter()
        for commands in (there, back):
            if together:
                for p in [subprocess.Popen(command) for command in commands]:
                    p.wait()
            else:
                for command in commands:
                    subprocess.run(command, check=True)
        return time.perf_counter() - t0
    finally:
        for end in ends:
            subprocess.run(["ip", "link", "del", end], check=False, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 64], help="calls at once (at most 64)")
    parser.add_argument(
        "--limit",
        default=DAEMONSET_LIMIT,
        help=f"the daemon's cgroup limit (default {DAEMONSET_LIMIT}, the DaemonSet's)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of each size; medians are printed")
    args = parser.parse_args()
    limit = budget.parse_size(args.limit)
    if max(args.sizes) > VFS:
        sys.exit(f"at most {VFS} calls: the pool has {VFS} VFs")
    lines: list[str] = []
    cores = os.cpu_count() or 1
    with bench_node("burst", VFS, ("host-local",)) as bench:
        print(f"{VFS} veth VFs, one PF, host-local IPAM, the daemon's cgroup: {limit / MiB:.0f} MiB", flush=True)
        header = (
            f"{'N':>3} {'mode':>18} {'ADDs s':>7} {'DELs s':>7} {'at once/1 by 1':>14} {'peak MiB':>8} "
            f"{'OOM kills':>9} {'failed':>6} {'daemon':>6} {'CPU s':>6} {'callers CPU s':>13} "
            f"{'cores busy':>10} {'others busy':>11}  admitted"
        )
        print(header, flush=True)
        lines.append(header)
        for n in args.sizes:
            runs: dict[str, list[Run]] = {mode: [] for mode, _, _ in MODES}
            for _ in range(args.repeats):
                for mode, together, limited in MODES:
                    runs[mode].append(
                        burst(
                            bench.node,
                            bench.work,
                            bench.bindir / "sriov",
                            bench.pods,
                            n,
                            together,
                            limit if limited else None,
                        )
                    )
            seq = statistics.median(r.seconds for r in runs[MODES[0][0]])
            for mode, _, _ in MODES:
                rs = runs[mode]
                total = statistics.median(r.seconds for r in rs)
                admitted = rs[-1].admitted
                line = (
                    f"{n:>3} {mode:>18} {statistics.median(r.add_s for r in rs):7.2f} "
                    f"{statistics.median(r.del_s for r in rs):7.2f} {total / seq:14.2f} "
                    f"{max(r.peak for r in rs) / MiB:8.1f} {sum(r.oom_kills for r in rs):>9} "
                    f"{sum(r.failed for r in rs):>6} {'alive' if all(r.alive for r in rs) else 'DIED':>6} "
                    f"{statistics.median(r.cpu_s for r in rs):6.2f} "
                    f"{statistics.median(r.callers_cpu_s for r in rs):13.2f} "
                    f"{statistics.median(r.ours for r in rs):10.2f} "
                    f"{statistics.median(r.others for r in rs):11.2f}  {admitted}"
                )
                print(line, flush=True)
                lines.append(line)
                for r in rs:
                    for error in r.errors[:3]:
                        print(f"    {error}", flush=True)
            # The calls' CPU time spread over every core: the fastest a burst
            # can be, unless it costs less CPU than the calls one by one.
            ours = statistics.median(r.ours for r in runs[MODES[0][0]])
            line = (
                f"{n:>3} one by one kept {ours:.2f} cores busy: on {cores} cores, a burst of the same CPU time "
                f"takes at least {ours / cores:.2f}x their time"
            )
            moves = [
                namespace_moves([os.path.basename(p) for p in bench.pods[:n]], together) for together in (False, True)
            ]
            line += (
                f"; {n} moves to a namespace and back take {moves[0]:.2f} s one by one, "
                f"{moves[1]:.2f} s at once ({moves[1] / moves[0]:.2f}x)"
            )
            print(line, flush=True)
            lines.append(line)
    print("\n".join(["", "==== summary", *lines]))


if __name__ == "__main__":
    main()
