#!/usr/bin/env python3
"""ADD+DEL latency, memory, phases, concurrency and allocation scale of ``sriov``.

Cycles: Go ``host-device`` and ``sriov`` take the same VF through the same
cycle (ADD into a pod namespace, DEL back) with host-local IPAM,
interleaved in one run, so the ratio holds even on a slow or emulated
machine.  ``sriov`` is measured as a node without Python runs it (the static
shim forwarding to the daemon), as the Python executable through the daemon
and in process (no daemon), and with its in-process IPAM.  A daemon's child
serves calls in turn; the cycles through a daemon whose children serve one
call each show what calls far apart cost, since each then runs in a child
that has served none.  Memory is the
peak RSS of the executable's own process (by GNU time, which forks it from a
small process: a process forked from this one would inherit this one's peak)
and of the daemon's child serving the call, with the child's private part
(what each call costs beyond the shared daemon), as the children report them
(``SRIOV_CNI_DAEMON_STATS``, see sriov_cni/daemon/measure.py).

Phases: one ADD and one DEL through the shim, profiled in the daemon's child
(``SRIOV_CNI_DAEMON_PROFILE``), charged to phases by tests/bench/phases.py.

Concurrency: 14 ADDs through the shim at once over a pool of 2 PFs x 7 VFs,
against the same 14 one after another.  ADDs take no node-wide lock (a VF's
record changes only under that VF's claim): whether the store has a lock
file after the run says so, and for the 14 ADDs at once, the time each spent
taking claims and how many claims were refused (a VF passed over because
another call held it), as the children report them.

Scale: the cost of one allocation (``allocate.reserve``) as pools of 8 to
1024 VFs fill, on a generated sysfs tree with the in-memory store, with as
many allocations for each size; and the resolution of the pool from sysfs,
which every ADD of a pool pays before it allocates.

Nodes: ``igb`` (the QEMU guest's emulated igb, or a real node with ``--pf``)
runs everything on real VFs; ``host`` runs on the host test fixtures (veth
ends as VF netdevs in a temporary sysfs, the PF side faked in the daemon;
the in-process peer needs a real PF side and is left out).  Needs root;
prints figures, asserts nothing.

    python3 tests/bench/bench_plugin.py                     # host fixtures
    python3 tests/vm/rig.py -- python3 tests/bench/bench_plugin.py
    python3 tests/bench/bench_plugin.py --pf ens1f0 --cycles 50   # a real node
    python3 tests/bench/bench_plugin.py --baseline main     # also main's daemon, interleaved
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import install, measure  # noqa: E402
from tests.bench import phases  # noqa: E402
from tests.support import daemonlib  # noqa: E402
from tests.support.hostnode import CODE_ENV  # noqa: E402

GO_PLUGINS = Path("/usr/lib/cni")
GNU_TIME = "/usr/bin/time"
CONCURRENT = 14
SCALE_POOLS = (8, 64, 256, 1024)
SCALE_ROUNDS = 2


# --- the node ------------------------------------------------------------------


@dataclass
class Vf:
    pci: str
    netdev: str


@dataclass
class Bench:
    """The VFs, PFs and daemon program (daemonlib.Daemon's) of the node under test."""

    kind: str
    pfs: list[str]
    vfs: list[Vf]
    daemon_program: Callable[..., list[str]]
    close: Any = None


def find_pfs() -> list[str]:
    return [
        dev.name for dev in sorted(Path("/sys/class/net").iterdir()) if (dev / "device" / "sriov_totalvfs").exists()
    ]


def vf_netdev(vf_pci: str) -> str:
    net = Path("/sys/bus/pci/devices") / vf_pci / "net"
    for _ in range(400):
        if net.exists() and os.listdir(net):
            return os.listdir(net)[0]
        time.sleep(0.05)
    sys.exit(f"VF {vf_pci} never got a netdev")


def igb_node(pfs: list[str], per_pf: int) -> Bench:
    """Real PFs with ``per_pf`` VFs each (created if they have another number)."""
    vfs = []
    for pf in pfs:
        dev = Path("/sys/class/net") / pf / "device"
        subprocess.run(["ip", "link", "set", pf, "up"], check=True)
        want = min(per_pf, int((dev / "sriov_totalvfs").read_text()))
        if int((dev / "sriov_numvfs").read_text()) != want:
            (dev / "sriov_numvfs").write_text("0")
            (dev / "sriov_numvfs").write_text(str(want))
        for i in range(want):
            pci = os.path.basename(os.readlink(dev / f"virtfn{i}"))
            vfs.append(Vf(pci, vf_netdev(pci)))
    return Bench("igb", pfs, vfs, daemonlib.command_line)


def host_node(work: Path, per_pf: int) -> Bench:
    from tests.support.hostnode import HostNode

    node = HostNode(work / "node", 2, per_pf)
    vfs = [Vf(vf.pci, str(vf.netdev)) for pf in node.node.pfs for vf in pf.vfs]
    return Bench("host", [pf.name for pf in node.node.pfs], vfs, node.daemon_command, node.close)


class Daemon:
    """The sriov-cni daemon of the node, reporting every call's costs into ``stats``."""

    def __init__(
        self,
        bench: Bench,
        sock: Path,
        stats: Path,
        profile: bool = False,
        code: Path = ROOT,
        calls_per_child: int | None = None,
    ) -> None:
        """``code``: the checkout whose package the daemon runs (another revision's has no reports)."""
        self.sock = sock
        self.stats = stats
        stats.mkdir(parents=True, exist_ok=True)
        env = {measure.STATS_ENV: str(stats), "PYTHONPATH": str(code), CODE_ENV: str(code)}
        if profile:
            env[measure.PROFILE_ENV] = "1"
        options: list[str] = []
        if calls_per_child is not None:
            # The host node's daemon (tests/support/hostnode.py) takes it among its PFs.
            options = (
                [f"calls={calls_per_child}"] if bench.kind == "host" else ["--calls-per-child", str(calls_per_child)]
            )
        self.seen: set[str] = set()
        self.daemon = daemonlib.Daemon(sock.parent, *options, program=bench.daemon_program, env=env, cwd=code)
        self.proc = self.daemon.proc

    def new_calls(self, expected: int) -> list[dict[str, Any]]:
        """Reports of the calls since the last look, at least ``expected`` of them.

        Each child writes its own after answering, so the last may lag.
        """
        deadline = time.monotonic() + 30
        while True:
            files = [f for f in self.stats.glob("*.json") if f.name not in self.seen]
            if len(files) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        out = []
        for f in files:
            self.seen.add(f.name)
            report = json.loads(f.read_text())
            report["name"] = f.stem
            out.append(report)
        return out

    def hwm_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.daemon.stop()


# --- running executables --------------------------------------------------------


def start(
    exe: Path, command: str, conf: dict[str, Any], env: dict[str, str], wrap: list[str] | None = None
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        (wrap or []) + [str(exe)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env, CNI_COMMAND=command),
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(conf).encode())
    proc.stdin.close()
    proc.stdin = None  # sent in full; communicate() must not flush it again
    return proc


def finish(proc: subprocess.Popen[bytes], what: str) -> str:
    """The call's stderr, once it ended; exits the benchmark on a failed call."""
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{what} failed ({proc.returncode}): {out.decode()} {err.decode()[-800:]}")
    return err.decode()


def node_cpu_seconds() -> float:
    """CPU time the whole node has spent, every process and the kernel, from /proc/stat (idle and iowait left out)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def invoke(exe: Path, command: str, conf: dict[str, Any], env: dict[str, str]) -> float:
    """Seconds one call of the executable took, until its stdout closed."""
    t0 = time.perf_counter()
    finish(start(exe, command, conf, env), f"{exe.name} {command}")
    return time.perf_counter() - t0


def own_peak_kib(exe: Path, command: str, conf: dict[str, Any], env: dict[str, str]) -> int | None:
    """Peak RSS of the executable's own process, as GNU time reports it."""
    if not os.path.exists(GNU_TIME):
        return None
    err = finish(start(exe, command, conf, env, [GNU_TIME, "-f", "maxrss=%M"]), f"{exe.name} {command}")
    lines = [line for line in err.splitlines() if line.startswith("maxrss=")]
    return int(lines[-1].split("=")[1]) if lines else None


# --- the parts of the report ---------------------------------------------------


@dataclass
class Peer:
    exe: Path
    conf: dict[str, Any]
    env: dict[str, str]
    via_daemon: bool
    times: list[float] = field(default_factory=list)
    # The node's CPU seconds per cycle: the executable, the daemon's child,
    # the IPAM plugin it runs and the kernel's work for them alike.
    cpu: list[float] = field(default_factory=list)
    own_kib: int | None = None


def cycles(peers: dict[str, Peer], n: int, daemon: Daemon) -> tuple[list[str], list[dict[str, Any]]]:
    """The table, and the daemon's reports of the timed calls."""
    for _ in range(n):
        # Interleaved, so drift in machine speed hits every peer alike.
        for peer in peers.values():
            cpu_before = node_cpu_seconds()
            t_add = invoke(peer.exe, "ADD", peer.conf, peer.env)
            t_del = invoke(peer.exe, "DEL", peer.conf, peer.env)
            peer.cpu.append(node_cpu_seconds() - cpu_before)
            peer.times.append(t_add + t_del)
    timed = daemon.new_calls(2 * n * sum(p.via_daemon for p in peers.values()))
    # Memory once per peer, outside the timed cycles (GNU time adds a fork).
    child: dict[str, tuple[int, int]] = {}
    for name, peer in peers.items():
        own_add = own_peak_kib(peer.exe, "ADD", peer.conf, peer.env)
        own_del = own_peak_kib(peer.exe, "DEL", peer.conf, peer.env)
        peer.own_kib = max(own_add or 0, own_del or 0) or None
        if peer.via_daemon:
            sriov = [r for r in daemon.new_calls(2) if r["program"] == "sriov"]
            child[name] = (max(r["maxrss_kib"] for r in sriov), max(r["private_kib"] for r in sriov))
    # CPU time of the daemon's child per cycle (ADD + DEL): steadier than
    # wall time on a shared machine, and what the daemon path can cut.
    cpu: dict[str, float] = {}
    for name, peer in peers.items():
        mine = [r for r in timed if r["program"] == "sriov" and r["container"] == peer.env["CNI_CONTAINERID"]]
        if mine:
            cpu[name] = sum(
                statistics.median(r["cpu_seconds"] for r in mine if r["command"] == command)
                for command in ("ADD", "DEL")
            )
    go = statistics.median(peers["host-device (Go)"].times)
    width = max(len(name) for name in peers)
    lines = [
        f"{'plugin':{width}} {'median ms':>9} {'min ms':>7} {'ratio':>6} {'child CPU ms':>12} {'exe peak MiB':>12} "
        f"{'child peak MiB':>14} {'child private MiB':>17}"
    ]
    for name, peer in peers.items():
        med = statistics.median(peer.times)
        own = f"{peer.own_kib / 1024:.1f}" if peer.own_kib else "n/a"
        peak, private = (
            (f"{child[name][0] / 1024:.1f}", f"{child[name][1] / 1024:.1f}") if name in child else ("-", "-")
        )
        spent = f"{cpu[name] * 1000:.1f}" if name in cpu else "-"
        lines.append(
            f"{name:{width}} {med * 1000:9.1f} {min(peer.times) * 1000:7.1f} {med / go:6.2f} {spent:>12} {own:>12} "
            f"{peak:>14} {private:>17}"
        )
    shim = statistics.median(peers["sriov, shim + daemon"].times)
    lines.append(f"shim + daemon / Go host-device: {shim / go:.2f} (same VF, host-local IPAM, this run)")
    go_cpu = statistics.mean(peers["host-device (Go)"].cpu)
    lines.append("node CPU per ADD+DEL cycle (every process and the kernel, /proc/stat), mean:")
    for name, peer in peers.items():
        mean = statistics.mean(peer.cpu)
        lines.append(f"  {name:{width}} {mean * 1000:8.1f} ms  {mean / go_cpu:5.2f}x host-device")
    lines.append(f"daemon process peak RSS: {daemon.hwm_kib() / 1024:.1f} MiB (one per node, shared by every call)")
    return lines, timed


def profiled(bench: Bench, work: Path, peer: Peer, timed: list[dict[str, Any]], code: Path = ROOT) -> list[str]:
    """One ADD and one DEL through the shim in a profiling daemon; ``timed``: the same calls unprofiled.

    ``code``: the checkout whose daemon is profiled (the baseline's, for a before/after).
    """
    unprofiled: dict[str, list[float]] = {}
    for report in timed:
        if report["program"] == "sriov":
            unprofiled.setdefault(report["command"], []).append(report["seconds"])
    where = "profile" if code == ROOT else "profile-baseline"
    daemon = Daemon(bench, work / f"run-{where}" / "plugin.sock", work / f"stats-{where}", profile=True, code=code)
    env = dict(peer.env, SRIOV_CNI_SOCKET=str(daemon.sock))
    try:
        walls = {command: invoke(peer.exe, command, peer.conf, env) for command in ("ADD", "DEL")}
        reports = daemon.new_calls(2)
    finally:
        daemon.stop()
    lines = []
    for command in ("ADD", "DEL"):
        [report] = [r for r in reports if r["program"] == "sriov" and r["command"] == command]
        samples = unprofiled.get(command) or []
        lines += phases.table(
            f"{command} in the daemon's child",
            daemon.stats / f"{report['name']}.prof",
            statistics.median(samples) if samples else None,
        )
        lines.append(f"  (the whole shim call took {walls[command] * 1000:.1f} ms with profiling)")
    return lines


def concurrency(bench: Bench, work: Path, shim: Path, base_env: dict[str, str], daemon: Daemon) -> list[str]:
    state = work / "state-pool"
    conf = {
        "cniVersion": "1.0.0",
        "name": "bench-pool",
        "type": "sriov",
        "pfNames": bench.pfs,
        "dataDir": str(state),
        "ipam": {"type": "host-local", "subnet": "10.98.0.0/24", "dataDir": str(work / "ipam-pool")},
    }
    token = uuid.uuid4().hex[:5]
    pods = [f"sriov-bench-{token}-{i}" for i in range(CONCURRENT)]
    for pod in pods:
        subprocess.run(["ip", "netns", "add", pod], check=True)

    def env(i: int) -> dict[str, str]:
        return dict(base_env, CNI_CONTAINERID=f"pool{i}", CNI_NETNS=f"/var/run/netns/{pods[i]}")

    def round_(command: str, together: bool) -> float:
        t0 = time.perf_counter()
        if together:
            procs = [start(shim, command, conf, env(i)) for i in range(CONCURRENT)]
            for i, proc in enumerate(procs):
                finish(proc, f"{command} {i}")
        else:
            for i in range(CONCURRENT):
                finish(start(shim, command, conf, env(i)), f"{command} {i}")
        return time.perf_counter() - t0

    try:
        daemon.new_calls(0)
        together = round_("ADD", True)
        # The ADDs at once, before any other call reports.
        reports = [r for r in daemon.new_calls(CONCURRENT) if r["command"] == "ADD" and r["program"] == "sriov"]
        round_("DEL", True)
        one_by_one = round_("ADD", False)
        round_("DEL", False)
        daemon.new_calls(3 * CONCURRENT)
    finally:
        for pod in pods:
            subprocess.run(["ip", "netns", "del", pod], check=False)
    # A store with a node-wide lock creates <dataDir>/lock on first use.
    node_wide = (state / "lock").exists()
    claims = [claim for r in reports for claim in r["claims"]]
    waited = [sum(seconds for seconds, _ in r["claims"]) for r in reports]
    refused = sum(not got for _, got in claims)
    ms = 1000.0
    return [
        f"{CONCURRENT} ADDs through the shim, pool of {len(bench.pfs)} PFs x {len(bench.vfs) // len(bench.pfs)} VFs: "
        f"at once {together * ms:.0f} ms, one after another {one_by_one * ms:.0f} ms "
        f"(at once / sequential {together / one_by_one:.2f})",
        f"node-wide store lock: {'TAKEN (' + str(state / 'lock') + ' exists)' if node_wide else 'none taken'}; "
        "each VF's record changes only under that VF's claim",
        f"claim waits per ADD ({len(reports)} ADDs at once, all claims of each): "
        f"median {statistics.median(waited) * ms:.2f} ms, max {max(waited) * ms:.2f} ms; "
        f"{refused} of {len(claims)} claims refused (VF passed over: another call held it)",
    ]


def scale(work: Path) -> list[str]:
    """Median time of ``allocate.reserve`` while a pool of N VFs fills, generated sysfs, memory store."""
    from sriov_cni.paths import Paths
    from sriov_cni.plugin import allocate, pool
    from tests.support.fakes import FakeHost, MemoryVfStore
    from tests.support.nodetree import Tree

    netns = "/proc/self/ns/net"
    inode = os.stat(netns).st_ino
    trees: dict[int, Tree] = {}
    spent: dict[int, list[float]] = {size: [] for size in SCALE_POOLS}
    resolve: dict[int, list[float]] = {size: [] for size in SCALE_POOLS}

    def fill(size: int) -> None:
        sys_root = trees[size].sys
        host = FakeHost(sys_root)
        t0 = time.perf_counter()
        candidates = pool.pool_vfs(sys_root, [pool.parse_pool_entry("pf0")])
        resolve[size].append(time.perf_counter() - t0)
        store = MemoryVfStore()
        for n in range(size):
            attachment = allocate.Attachment(f"c-{n}", "net1", "net", netns, inode)
            t0 = time.perf_counter()
            lease = allocate.reserve(store, allocate.Candidates(candidates), attachment, host, Paths(sys=sys_root))
            spent[size].append(time.perf_counter() - t0)
            lease.claim.drop()

    try:
        for size in SCALE_POOLS:
            trees[size] = tree = Tree(work / f"scale-{size}")
            tree.pf("0000:01:00.0", "pf0", total=size, numvfs=size)
            for i in range(size):
                tree.vf("0000:01:00.0", i, f"0000:02:{i // 8:02x}.{i % 8}", f"pf0v{i}")
        # Every pool size gets the same number of allocations (a small pool
        # is filled many times), in rounds that visit every size, so that
        # warm-up and a shared machine's slow spells fall on all of them.
        fill(SCALE_POOLS[0])
        spent[SCALE_POOLS[0]].clear()
        resolve[SCALE_POOLS[0]].clear()
        for _ in range(SCALE_ROUNDS):
            for size in SCALE_POOLS:
                for _ in range(SCALE_POOLS[-1] // size):
                    fill(size)
    finally:
        for size in trees:
            shutil.rmtree(work / f"scale-{size}", ignore_errors=True)
    lines = [
        f"{'VFs in pool':>11} {'allocations':>11} {'per allocation us (median while filling)':>40} {'pool resolve ms':>15}"
    ]
    # Medians: a shared machine's preemptions would dominate a mean.
    per = {size: statistics.median(spent[size]) for size in SCALE_POOLS}
    for size in SCALE_POOLS:
        lines.append(
            f"{size:>11} {len(spent[size]):>11} {per[size] * 1e6:40.1f} {statistics.median(resolve[size]) * 1000:15.2f}"
        )
    first, last = per[SCALE_POOLS[0]], per[SCALE_POOLS[-1]]
    lines.append(f"per allocation, {SCALE_POOLS[-1]} / {SCALE_POOLS[0]} VFs: {last / first:.2f} (goal <= 1.2)")
    return lines


# --- main -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--node",
        choices=("auto", "igb", "host"),
        default="auto",
        help="igb: real SR-IOV PFs; host: the veth fixtures (auto: igb when a PF is found)",
    )
    parser.add_argument("--pf", action="append", help="SR-IOV PF netdev (repeatable; default: every PF found)")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also run the shim against the daemon of this git revision, interleaved (before/after)",
    )
    parser.add_argument("--skip", action="append", default=[], choices=("cycles", "phases", "concurrency", "scale"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sriov-bench-"))
    report: list[str] = []
    if "scale" not in args.skip:
        lines = scale(work)
        report += ["", "== allocation scale (generated sysfs, memory store)", *lines]
        print("\n".join(report), flush=True)
    kind = args.node
    pfs = args.pf or find_pfs()
    if kind == "auto":
        kind = "igb" if pfs else "host"
    per_pf = CONCURRENT // 2
    bench = igb_node(pfs, per_pf) if kind == "igb" else host_node(work, per_pf)
    vf = bench.vfs[0]
    bindir = work / "bin"
    install.install(str(bindir), sys.executable)
    shimdir = work / "shim-bin"
    install.install(str(shimdir))
    for name in ("host-device", "host-local"):
        os.symlink(GO_PLUGINS / name, bindir / name)
        os.symlink(GO_PLUGINS / name, shimdir / name)
    netns = f"sriov-bench-{uuid.uuid4().hex[:5]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    daemon = Daemon(bench, work / "run" / "plugin.sock", work / "stats")

    def ipam(kind: str) -> dict[str, object]:
        return {"type": kind, "subnet": "10.99.0.0/24", "dataDir": str(work / f"ipam-{kind}")}

    def sriov(ipam_kind: str) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "sriov",
            "deviceID": vf.pci,
            "dataDir": str(work / "state"),
            "ipam": ipam(ipam_kind),
        }

    base_env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_CONTAINERID": "bench",
        "CNI_NETNS": f"/var/run/netns/{netns}",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bindir),
    }
    via = dict(base_env, SRIOV_CNI_SOCKET=str(daemon.sock))
    peers = {
        "host-device (Go)": Peer(
            bindir / "host-device",
            {
                "cniVersion": "1.0.0",
                "name": "bench",
                "type": "host-device",
                "device": vf.netdev,
                "ipam": ipam("host-local"),
            },
            base_env,
            False,
        ),
        "sriov, shim + daemon": Peer(shimdir / "sriov", sriov("host-local"), dict(via, CNI_CONTAINERID="shim"), True),
        "sriov, Python + daemon": Peer(bindir / "sriov", sriov("host-local"), dict(via, CNI_CONTAINERID="py"), True),
        "sriov, shim + sriov-ipam": Peer(
            shimdir / "sriov", sriov("sriov-ipam"), dict(via, CNI_CONTAINERID="ipam"), True
        ),
    }
    # Calls far apart find only children that have served none: each call
    # then copies the daemon's pages it writes (see options.CALLS_PER_CHILD).
    fresh = Daemon(bench, work / "run-fresh" / "plugin.sock", work / "stats-fresh", calls_per_child=1)
    peers["sriov, shim + daemon, fresh child per call"] = Peer(
        shimdir / "sriov",
        sriov("host-local"),
        dict(base_env, SRIOV_CNI_SOCKET=str(fresh.sock), CNI_CONTAINERID="fresh"),
        False,  # its reports are in its own directory
    )
    baseline: Daemon | None = None
    if args.baseline:
        code = work / "baseline"
        code.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(code)], input=archive.stdout, check=True)
        baseline = Daemon(bench, work / "run-baseline" / "plugin.sock", work / "stats-baseline", code=code)
        peers[f"sriov, shim + daemon@{args.baseline[:7]}"] = Peer(
            shimdir / "sriov",
            sriov("host-local"),
            dict(base_env, SRIOV_CNI_SOCKET=str(baseline.sock), CNI_CONTAINERID="base"),
            False,  # its reports, if that revision writes any, are not collected
        )
    if kind == "igb":
        peers["sriov, in process"] = Peer(
            bindir / "sriov", sriov("host-local"), dict(base_env, SRIOV_CNI_SOCKET=str(work / "no-daemon.sock")), False
        )

    def part(title: str, lines: list[str]) -> None:
        report.extend(["", f"== {title}", *lines])
        print("\n".join(["", f"== {title}", *lines]), flush=True)

    timed: list[dict[str, Any]] = []
    try:
        if "cycles" not in args.skip:
            lines, timed = cycles(peers, args.cycles, daemon)
            part(
                f"ADD+DEL cycles on VF {vf.pci} ({vf.netdev}), {args.cycles} each, {kind} node, "
                "host-local IPAM unless noted",
                lines,
            )
        if "phases" not in args.skip:
            shim_peer = peers["sriov, shim + daemon"]
            same = [r for r in timed if r["container"] == shim_peer.env["CNI_CONTAINERID"]]
            part("phases of one ADD and one DEL through the shim", profiled(bench, work, shim_peer, same))
            if args.baseline:
                base_peer = peers[f"sriov, shim + daemon@{args.baseline[:7]}"]
                part(
                    f"phases of one ADD and one DEL through the shim, daemon@{args.baseline[:7]}",
                    profiled(bench, work, base_peer, [], work / "baseline"),
                )
        if "concurrency" not in args.skip:
            part("concurrency", concurrency(bench, work, shimdir / "sriov", via, daemon))
    finally:
        daemon.stop()
        fresh.stop()
        if baseline is not None:
            baseline.stop()
        subprocess.run(["ip", "netns", "del", netns], check=False)
        if bench.close is not None:
            bench.close()
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(["", "==== summary", *report]))


if __name__ == "__main__":
    main()
