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
run, and how many calls at once the daemon admitted (from its banner).
Asserts nothing; exits non-zero only when the fixtures cannot be built.

    python3 tests/bench/bench_burst.py                       # N = 8, 32, 64, limit 160Mi
    python3 tests/bench/bench_burst.py --sizes 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.daemonlib import Daemon  # noqa: E402
from tests.support.hostnode import HostNode  # noqa: E402
from tests.support.memcg import MemoryCgroup  # noqa: E402

from sriov_cni.daemon import budget, install  # noqa: E402

GO_PLUGINS = Path("/usr/lib/cni")
VFS = 64
# The daemon container's limit in deploy/daemonset.yaml.
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
    banner: str
    errors: list[str]


def burst(node: HostNode, work: Path, shim: Path, pods: list[str], n: int, together: bool,
          limit: int | None) -> Run:
    """N ADDs then N DELs through a fresh daemon in a fresh cgroup."""
    cgroup = MemoryCgroup(limit, "sriov-cni-bench")
    sock = work / f"run-{uuid.uuid4().hex[:6]}" / "plugin.sock"
    daemon = Daemon(sock.parent, program=node.daemon_command, wrapper=cgroup.wrap([]), env={"PYTHONPATH": str(ROOT)})
    proc, banner = daemon.proc, daemon.banner.strip()
    conf = json.dumps({
        "cniVersion": "1.0.0", "name": "burst", "type": "sriov", "pfNames": [pf.name for pf in node.node.pfs],
        "dataDir": str(work / "state"),
        "ipam": {"type": "host-local", "subnet": "10.96.0.0/24", "dataDir": str(work / "ipam")},
    }).encode()
    errors: list[str] = []

    def env(i: int, command: str) -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": command, "CNI_CONTAINERID": f"burst{i}",
                "CNI_NETNS": pods[i], "CNI_IFNAME": "net1", "CNI_PATH": str(shim.parent),
                "SRIOV_CNI_SOCKET": str(sock)}

    def call(i: int, command: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([str(shim)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env(i, command))
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
        add_s = phase("ADD")
        del_s = phase("DEL")
        alive = proc.poll() is None
        peak, kills = cgroup.peak(), cgroup.oom_kills()
    finally:
        daemon.stop()
        cgroup.remove()
    return Run(n, add_s, del_s, peak, kills, len(errors), alive,
               banner, errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32, 64], help="calls at once (at most 64)")
    parser.add_argument("--limit", default=DAEMONSET_LIMIT,
                        help=f"the daemon's cgroup limit (default {DAEMONSET_LIMIT}, the DaemonSet's)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each size; medians are printed")
    args = parser.parse_args()
    limit = budget.parse_size(args.limit)
    if max(args.sizes) > VFS:
        sys.exit(f"at most {VFS} calls: the pool has {VFS} VFs")
    work = Path(tempfile.mkdtemp(prefix="sriov-burst-"))
    node = HostNode(work / "node", 1, VFS)
    shimdir = work / "bin"
    install.install(str(shimdir))
    os.symlink(GO_PLUGINS / "host-local", shimdir / "host-local")
    token = uuid.uuid4().hex[:5]
    names = [f"sriov-burst-{token}-{i}" for i in range(VFS)]
    for name in names:
        subprocess.run(["ip", "netns", "add", name], check=True)
    pods = [f"/var/run/netns/{name}" for name in names]
    lines: list[str] = []
    try:
        print(f"{VFS} veth VFs, one PF, host-local IPAM, the daemon's cgroup: {limit / MiB:.0f} MiB", flush=True)
        header = (f"{'N':>3} {'mode':>18} {'ADDs s':>7} {'DELs s':>7} {'at once/1 by 1':>14} {'peak MiB':>8} "
                  f"{'OOM kills':>9} {'failed':>6} {'daemon':>6}  admitted")
        print(header, flush=True)
        lines.append(header)
        for n in args.sizes:
            runs: dict[str, list[Run]] = {mode: [] for mode, _, _ in MODES}
            for _ in range(args.repeats):
                for mode, together, limited in MODES:
                    runs[mode].append(burst(node, work, shimdir / "sriov", pods, n, together,
                                            limit if limited else None))
            seq = statistics.median(r.add_s + r.del_s for r in runs[MODES[0][0]])
            for mode, _, _ in MODES:
                rs = runs[mode]
                total = statistics.median(r.add_s + r.del_s for r in rs)
                admitted = rs[-1].banner.partition(", ")[2].partition(" (")[0]
                line = (f"{n:>3} {mode:>18} {statistics.median(r.add_s for r in rs):7.2f} "
                        f"{statistics.median(r.del_s for r in rs):7.2f} {total / seq:14.2f} "
                        f"{max(r.peak for r in rs) / MiB:8.1f} {sum(r.oom_kills for r in rs):>9} "
                        f"{sum(r.failed for r in rs):>6} {'alive' if all(r.alive for r in rs) else 'DIED':>6}  "
                        f"{admitted}")
                print(line, flush=True)
                lines.append(line)
                for r in rs:
                    for error in r.errors[:3]:
                        print(f"    {error}", flush=True)
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], check=False)
        node.close()
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(["", "==== summary", *lines]))


if __name__ == "__main__":
    main()
