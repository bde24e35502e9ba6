#!/usr/bin/env python3
"""Pod readiness: seconds from a pair's first ADD to traffic both ways, on freshly created and on reused VFs.

Each round starts from 0 VFs on the first igb PF of the rig's guest (or
``--pf``) and creates 4.  Fresh: four pods get VFs 0-3, two by two; for
each pair, the clock starts when the pair's first ADD is called (a
runtime calls a pod's networks one after another) and stops when each pod
has had a reply from the other (``ping -c 1 -W 1``, tried again until
then, at most ``--bound`` seconds).  Reused: the four pods are deleted
(CNI DEL) and four new ones get the same VFs, timed the same way.  The
figures are the median and maximum over all pairs of all rounds, with the
median and maximum duration of the ADD calls themselves (a wait inside
ADD shows in both), and each peer's readiness over host-device's.

Compared in the same guest boot, interleaved round by round:

* ``sriov``: this checkout through its daemon (``sriov-cni daemon``),
  called through the static shim ``sriov-cni install-cni`` writes, as on a
  node, on VFs its ``sriov-cni setup`` created;
* ``sriov numvfs``: the same on VFs created by a plain ``sriov_numvfs``
  write, as other tools create them;
* ``sriov in-process`` (``--in-process``): this checkout's ``sriov``
  executable without a daemon, as podman users run it, on setup's VFs;
* ``sriov@REV numvfs`` (``--baseline REV``): a git revision of this
  repository, extracted to a temporary directory, through its own daemon
  on VFs created by a plain ``sriov_numvfs`` write;
* ``host-device``: the Go reference plugin (``/usr/lib/cni/host-device``,
  static IPAM), its VFs created by a plain ``sriov_numvfs`` write with the
  PF up, as a node without sriov-cni would.

The first ADD of a round comes ``--settle`` seconds after the VFs were
created.  Pods have no ``mac`` (as in the demo).  Attaches slower than
``--report-above`` seconds print the guest's igb/igbvf kernel log lines
since the round began.  With ``--phases``, each daemon runs its calls under
cProfile and the ADDs' time is broken down by phase (tests/bench/phases.py),
fresh and reused apart, with how many whole-PF VF-info dumps each made.  Needs root; prints figures, asserts nothing::

    python3 tests/vm/rig.py --pfs 1 -- python3 tests/bench/bench_attach.py --rounds 5 --baseline HEAD~3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import measure  # noqa: E402
from tests.bench import phases  # noqa: E402

GO_PLUGINS = Path("/usr/lib/cni")
SYS_NET = Path("/sys/class/net")
PODS = 4  # on VFs 0-3, two pairs
CALIBRATION = 10
# RTNL is a mutex: its holds are traced on the mutex itself, since
# rtnl_lock() is inlined into its callers in rtnetlink.c (the netlink
# requests' own path), where a probe on it sees nothing.
RTNL_PROGRAM = """
kprobe:mutex_lock, kprobe:mutex_lock_killable /arg0 == kaddr("rtnl_mutex")/ { @want[tid] = 1; }
kretprobe:mutex_lock /@want[tid]/ { @held[tid] = nsecs; delete(@want[tid]); }
kretprobe:mutex_lock_killable /@want[tid]/ { if (retval == 0) { @held[tid] = nsecs; } delete(@want[tid]); }
kprobe:mutex_trylock /arg0 == kaddr("rtnl_mutex")/ { @want[tid] = 1; }
kretprobe:mutex_trylock /@want[tid]/ { if (retval) { @held[tid] = nsecs; } delete(@want[tid]); }
kprobe:mutex_unlock /arg0 == kaddr("rtnl_mutex") && @held[tid]/ {
  printf("%lld %lld %s\\n", @held[tid], nsecs - @held[tid], comm); delete(@held[tid]);
}
"""
SUBNET = "10.84.{}.0/24"


@dataclass
class Peer:
    name: str
    code: Path | None  # a checkout of sriov-cni; None: host-device
    subnet: int
    # Who creates the VFs for it: the checkout's setup, or a plain sriov_numvfs write.
    created_by: str = "setup"
    # Whether its calls go to the checkout's daemon, or run in process.
    daemon: bool = True
    socket: Path | None = None  # the checkout's daemon, or where none listens
    # The CNI executables the runtime calls: the checkout's bin/ (in
    # process, or the Python client), else the static shim as install-cni
    # writes it on a node.
    plugins: Path | None = None
    attach: dict[str, list[float]] = field(default_factory=lambda: {"fresh": [], "reused": []})
    add: dict[str, list[float]] = field(default_factory=lambda: {"fresh": [], "reused": []})
    # With --phases: where its daemon's children leave each call's profile,
    # the ones already read, and the seconds (and dumps) per phase summed over ADDs.
    stats: Path | None = None
    seen: set[Path] = field(default_factory=set)
    phases: dict[str, dict[str, float]] = field(default_factory=lambda: {"fresh": {}, "reused": {}})
    dumps: dict[str, list[int]] = field(default_factory=lambda: {"fresh": [], "reused": []})
    # With --rtnl: each call's (verb, start, end), CLOCK_MONOTONIC nanoseconds.
    calls: list[tuple[str, int, int]] = field(default_factory=list)


def igb_pf() -> str:
    for dev in sorted(SYS_NET.iterdir()):
        if (dev / "device" / "sriov_totalvfs").exists() and (dev / "device" / "driver").resolve().name == "igb":
            return dev.name
    sys.exit("bench_attach: no igb PF (run it in the rig's guest, or give --pf)")


def sh(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, **kw)


def numvfs(pf: str) -> int:
    return int((SYS_NET / pf / "device" / "sriov_numvfs").read_text())


def vf_netdev(pf: str, vf: int) -> str:
    return next((SYS_NET / pf / "device" / f"virtfn{vf}" / "net").iterdir()).name


def carrier(ifname: str, netns: str | None = None) -> bool:
    out = sh("ip", "-j", *(["-n", netns] if netns else []), "link", "show", "dev", ifname, check=False)
    return out.returncode == 0 and "LOWER_UP" in json.loads(out.stdout)[0].get("flags", [])


def wait(what: str, predicate: Any, bound: float = 60.0) -> None:
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"bench_attach: no {what} within {bound:g} s")
        time.sleep(0.05)


def remove_vfs(pf: str) -> None:
    if numvfs(pf):
        (SYS_NET / pf / "device" / "sriov_numvfs").write_text("0")
    wait("VF removal", lambda: not any((SYS_NET / pf / "device").glob("virtfn*")))


def create_vfs(peer: Peer, pf: str, work: Path, count: int) -> None:
    remove_vfs(pf)
    if peer.created_by == "numvfs":
        sh("ip", "link", "set", pf, "up")
        wait(f"carrier on {pf}", lambda: carrier(pf))
        (SYS_NET / pf / "device" / "sriov_numvfs").write_text(str(count))
        wait("VF netdevs", lambda: all((SYS_NET / pf / "device" / f"virtfn{i}" / "net").is_dir() for i in range(count)))
        return
    assert peer.code is not None
    config = work / "node.yaml"
    config.write_text(f"pfs:\n  - pf: {pf}\n    numVfs: {count}\n")
    sh(
        sys.executable,
        str(peer.code / "bin" / "sriov-cni"),
        "setup",
        "--config",
        str(config),
        "--data-dir",
        str(work / "data"),
        "--state-file",
        str(work / "node.json"),
    )


def conf(peer: Peer, pf: str, vf: int, work: Path) -> dict[str, Any]:
    if peer.code is None:
        address = f"10.84.{peer.subnet}.{10 + vf}/24"
        return {
            "cniVersion": "1.0.0",
            "name": "bench-attach",
            "type": "host-device",
            "device": vf_netdev(pf, vf),
            "ipam": {"type": "static", "addresses": [{"address": address}]},
        }
    return {
        "cniVersion": "1.0.0",
        "name": "bench-attach",
        "type": "sriov",
        # The pods' VFs only: the reused ones are the fresh ones again.
        "pfNames": [f"{pf}#0-{PODS - 1}"],
        "dataDir": str(work / "data"),
        "ipam": {"type": "sriov-ipam", "subnet": SUBNET.format(peer.subnet), "dataDir": str(work / "ipam")},
    }


def cni(peer: Peer, command: str, pod: str, config: dict[str, Any], verb: str = "") -> dict[str, Any]:
    plugins = GO_PLUGINS if peer.code is None else peer.plugins or peer.code / "bin"
    exe = plugins / config["type"]
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": pod,
        "CNI_NETNS": f"/var/run/netns/{pod}",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(plugins),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    if peer.socket is not None:
        env["SRIOV_CNI_SOCKET"] = str(peer.socket)
    started = time.monotonic_ns()
    out = subprocess.run([str(exe)], input=json.dumps(config), env=env, capture_output=True, text=True)
    peer.calls.append((verb or command, started, time.monotonic_ns()))
    if out.returncode != 0:
        sys.exit(f"bench_attach: {peer.name} {command} {pod}: {out.stdout}{out.stderr}")
    return json.loads(out.stdout) if out.stdout.strip() else {}


def address(result: dict[str, Any]) -> str:
    return str(result["ips"][0]["address"].split("/")[0])


def traffic(pods: list[str], addresses: list[str], bound: float) -> float | None:
    """Seconds until each pod got a reply from the other; None past ``bound``."""
    start = time.monotonic()
    done = [False, False]
    while time.monotonic() - start < bound:
        for i in (0, 1):
            if not done[i]:
                ping = sh("ip", "netns", "exec", pods[i], "ping", "-c", "1", "-W", "1", addresses[1 - i], check=False)
                done[i] = ping.returncode == 0
        if all(done):
            return time.monotonic() - start
    return None


def kernel_log(since: int) -> list[str]:
    lines = sh("dmesg").stdout.splitlines()[since:]
    return [line for line in lines if "igb" in line]


def dmesg_lines() -> int:
    return len(sh("dmesg").stdout.splitlines())


def phase(peer: Peer, kind: str, pf: str, work: Path, tag: str, args: argparse.Namespace, log_from: int) -> list[str]:
    """Four pods on VFs 0-3, two by two, each pair timed; returns the pods."""
    pods = []
    for first in range(0, PODS, 2):
        pair, addresses = [], []
        for vf in (first, first + 1):
            pod = f"{tag}-{vf}"
            sh("ip", "netns", "add", pod)
        first_add = time.monotonic()
        for vf in (first, first + 1):
            pod = f"{tag}-{vf}"
            started = time.monotonic()
            result = cni(peer, "ADD", pod, conf(peer, pf, vf, work), f"ADD {kind}")
            peer.add[kind].append(time.monotonic() - started)
            charge_phases(peer, kind)
            pair.append(pod)
            addresses.append(address(result))
        seconds = traffic(pair, addresses, args.bound)
        ready = None if seconds is None else time.monotonic() - first_add
        peer.attach[kind].append(args.bound if ready is None else ready)
        shown = f"none within {args.bound:g} s" if ready is None else f"{ready:.1f} s after the first ADD"
        adds = ", ".join(f"{t:.1f}" for t in peer.add[kind][-2:])
        print(f"  {peer.name} {kind} {pair}: ADDs {adds} s; traffic both ways {shown}", flush=True)
        if seconds is None or seconds > args.report_above:
            print(f"    carrier now {[carrier('net1', pod) for pod in pair]}; igb/igbvf kernel log of the round:")
            for line in kernel_log(log_from):
                print(f"    {line}", flush=True)
        pods += pair
    return pods


def new_add_profile(peer: Peer) -> Path:
    """The profile of the ADD just answered: its child writes it, then its report, after answering.

    Reports of other calls (the DELs before) are passed over, whenever they come.
    """
    assert peer.stats is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for report in sorted(set(peer.stats.glob("*.json")) - peer.seen):
            peer.seen.add(report)
            if json.loads(report.read_text()).get("command") == "ADD":
                return report.with_suffix(".prof")
        time.sleep(0.05)
    sys.exit(f"bench_attach: {peer.name}'s daemon wrote no report of its ADD within 30 s")


def charge_phases(peer: Peer, kind: str) -> None:
    if peer.stats is None:
        return
    prof = new_add_profile(peer)
    seconds, _, _ = phases.breakdown(prof)
    for name, value in seconds.items():
        peer.phases[kind][name] = peer.phases[kind].get(name, 0.0) + value
    peer.dumps[kind].append(phases.calls(prof, phases.VF_INFO_DUMP))


def phase_table(peer: Peer, kind: str) -> list[str]:
    adds = len(peer.dumps[kind])
    if not adds:
        return []
    total = sum(peer.phases[kind].values())
    lines = [
        f"{peer.name} {kind}: mean ADD {total / adds * 1000:.0f} ms under cProfile over {adds} ADDs,"
        f" whole-PF VF-info dumps per ADD {statistics.mean(peer.dumps[kind]):.1f}"
    ]
    for name, value in sorted(peer.phases[kind].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:42} {value / adds * 1000:8.1f} ms {value / total:6.1%}")
    return lines


def delete(peer: Peer, pods: list[str], pf: str, work: Path, kind: str) -> None:
    for pod in pods:
        vf = int(pod.rsplit("-", 1)[1])
        config = conf(peer, pf, vf, work) if peer.code is not None else None
        if config is None:
            # host-device finds its device by name; it is in the pod as net1 now.
            config = {
                "cniVersion": "1.0.0",
                "name": "bench-attach",
                "type": "host-device",
                "device": f"bench{vf}",
                "ipam": {"type": "static", "addresses": [{"address": f"10.84.{peer.subnet}.{10 + vf}/24"}]},
            }
        cni(peer, "DEL", pod, config, f"DEL {kind}")
        sh("ip", "netns", "del", pod)


def round_(peer: Peer, pf: str, n: int, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-attach-") as tmp:
        work = Path(tmp)
        log_from = dmesg_lines()
        create_vfs(peer, pf, work, args.vfs)
        if peer.code is None:
            # host-device's DEL names the device it gives back: give each VF a
            # name that does not depend on the order the kernel probed them.
            for vf in range(PODS):
                sh("ip", "link", "set", vf_netdev(pf, vf), "name", f"bench{vf}")
        # Before the first pod: a device plugin or an operator advertises new
        # VFs seconds after they appear.
        time.sleep(args.settle)
        tag = f"r{n}{peer.subnet}"
        pods = phase(peer, "fresh", pf, work, f"{tag}f", args, log_from)
        delete(peer, pods, pf, work, "fresh")
        pods = phase(peer, "reused", pf, work, f"{tag}u", args, log_from)
        delete(peer, pods, pf, work, "reused")
        remove_vfs(pf)


def start_daemon(peer: Peer, run: Path, profile: bool, options: list[str]) -> subprocess.Popen[bytes] | None:
    assert peer.code is not None
    run.mkdir(parents=True, exist_ok=True)
    peer.socket = run / f"{peer.subnet}" / "plugin.sock"
    if not peer.daemon:
        return None  # nothing listens there: the executable runs the call in process
    if peer.code == ROOT:
        # As on a node: the runtime runs the static shim, which needs no Python.
        peer.plugins = run / f"{peer.subnet}" / "bin"
        sh(sys.executable, str(ROOT / "bin" / "sriov-cni"), "install-cni", "--dest", str(peer.plugins), "--create-dest")
    cmd = [sys.executable, str(peer.code / "bin" / "sriov-cni"), "daemon", "--socket", str(peer.socket), *options]
    log = (run / f"daemon-{peer.subnet}.log").open("wb")
    env = dict(os.environ)
    if profile and peer.code == ROOT:
        peer.stats = run / f"stats-{peer.subnet}"
        peer.stats.mkdir()
        env.update({measure.STATS_ENV: str(peer.stats), measure.PROFILE_ENV: "1"})
    daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    socket = peer.socket
    # Its start-up (imports, a first child) takes minutes in a loaded emulated guest.
    wait(f"{peer.name}'s daemon listening on {socket}", lambda: socket.exists() or daemon.poll() is not None, 600)
    if daemon.poll() is not None:
        sys.exit(f"bench_attach: {peer.name}'s daemon ended: {(run / f'daemon-{peer.subnet}.log').read_text()}")
    return daemon


class RtnlTrace:
    """Every hold of the kernel's RTNL in the guest, by bpftrace's kprobes: when it began, how long, by which task.

    A call is charged with the holds that began while it ran, whoever held
    the lock (a kernel worker the call set going counts too): what other
    RTNL users on the node waited behind.
    """

    def __init__(self, work: Path) -> None:
        tracing = Path("/sys/kernel/tracing")
        if not (tracing / "kprobe_events").exists():
            sh("mount", "-t", "tracefs", "tracefs", str(tracing))
        script, self.out = work / "rtnl.bt", work / "rtnl.out"
        script.write_text(RTNL_PROGRAM)
        self.proc = subprocess.Popen(["bpftrace", str(script)], stdout=self.out.open("w"), stderr=subprocess.STDOUT)
        wait("bpftrace attached", lambda: "Attaching" in self.out.read_text() or self.proc.poll() is not None, 300)
        if self.proc.poll() is not None:
            sys.exit(f"bench_attach: bpftrace ended: {self.out.read_text()}")
        # What the figures are worth: requests that each take RTNL once.
        started = time.monotonic_ns()
        for _ in range(CALIBRATION):
            sh("ip", "link", "set", "dev", "lo", "mtu", "65536")
        self.calibration = (started, time.monotonic_ns())

    def holds(self) -> list[tuple[int, int, str]]:
        self.proc.terminate()
        self.proc.wait()
        out = []
        text = self.out.read_text()
        start, end = self.calibration
        seen = sum(1 for line in text.splitlines() if line.endswith(" ip") and start <= int(line.split()[0]) < end)
        print(f"RTNL trace: {seen} holds by ip seen for {CALIBRATION} ip link requests", flush=True)
        for line in text.splitlines():
            if "Lost" in line:
                print(f"RTNL trace: bpftrace: {line}", flush=True)
            fields = line.split(maxsplit=2)
            if len(fields) == 3 and fields[0].isdigit():
                out.append((int(fields[0]), int(fields[1]), fields[2]))
        return out


def rtnl_table(peers: list[Peer], holds: list[tuple[int, int, str]]) -> list[str]:
    lines = ["\nRTNL held per call (holds that began during it, any task): mean total, max total, longest hold, holds"]
    for peer in peers:
        by_verb: dict[str, list[list[int]]] = {}
        for verb, start, end in peer.calls:
            mine = [length for began, length, _ in holds if start <= began < end]
            by_verb.setdefault(verb, []).append([sum(mine), max(mine, default=0), len(mine)])
        for verb, rows in sorted(by_verb.items()):
            totals = [r[0] for r in rows]
            lines.append(
                f"{peer.name:>18} {verb:>10}: {statistics.mean(totals) / 1e6:7.2f} ms  {max(totals) / 1e6:7.2f} ms"
                f"  {max(r[1] for r in rows) / 1e6:7.2f} ms  {statistics.mean(r[2] for r in rows):5.1f}  (n={len(rows)})"
            )
    return lines


def figures(values: list[float]) -> str:
    return f"median {statistics.median(values):5.2f} s  max {max(values):5.2f} s  (n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pf", help="SR-IOV PF (default: the first igb PF)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="a git revision of this repository to measure too")
    parser.add_argument("--no-peer", action="store_true", help="leave host-device out")
    parser.add_argument("--in-process", action="store_true", help="measure the executable without a daemon too")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds from creating the VFs to the first ADD")
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait for traffic before giving up")
    parser.add_argument("--vfs", type=int, default=PODS, help=f"VFs to create (the pods use VFs 0-{PODS - 1})")
    parser.add_argument("--rtnl", action="store_true", help="trace the kernel's RTNL holds (bpftrace) during calls")
    parser.add_argument(
        "--daemon-option", action="append", default=[], help="an option for every daemon started (repeat it)"
    )
    parser.add_argument("--phases", action="store_true", help="profile this checkout's daemon calls, by phase")
    parser.add_argument("--report-above", type=float, default=5.0, help="print the kernel log for slower attaches")
    args = parser.parse_args()
    pf = args.pf or igb_pf()
    with tempfile.TemporaryDirectory(prefix="bench-attach-code-") as tmp:
        peers = [Peer("sriov", ROOT, 1), Peer("sriov numvfs", ROOT, 4, created_by="numvfs")]
        if args.in_process:
            peers.append(Peer("sriov in-process", ROOT, 5, daemon=False))
        if args.baseline:
            code = Path(tmp) / "baseline"
            code.mkdir()
            git = ["git", "-c", "safe.directory=*", "-C", str(ROOT), "archive", args.baseline]
            archive = subprocess.run(git, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
            # On VFs created by a plain sriov_numvfs write: what a revision
            # does without its setup's first open shows there.
            peers.append(Peer(f"sriov@{args.baseline} numvfs", code, 2, created_by="numvfs"))
        if not args.no_peer:
            peers.append(Peer("host-device", None, 3, created_by="numvfs"))
        started = [
            start_daemon(peer, Path(tmp) / "run", args.phases, args.daemon_option)
            for peer in peers
            if peer.code is not None
        ]
        daemons = [daemon for daemon in started if daemon is not None]
        trace = RtnlTrace(Path(tmp)) if args.rtnl else None
        try:
            for n in range(args.rounds):
                for peer in peers:
                    round_(peer, pf, n, args)
                print(f"round {n + 1}/{args.rounds} done", flush=True)
        finally:
            for daemon in daemons:
                daemon.terminate()
                daemon.wait()
            holds = trace.holds() if trace is not None else []
    print(
        f"\nseconds from the pair's first ADD to a ping both ways ({args.rounds} rounds, {PODS} pods on {args.vfs} VFs)"
    )
    peer_ready = {kind: statistics.median(peers[-1].attach[kind]) for kind in ("fresh", "reused")}
    for peer in peers:
        for kind in ("fresh", "reused"):
            ratio = (
                "" if args.no_peer else f"  {statistics.median(peer.attach[kind]) / peer_ready[kind]:.2f}x host-device"
            )
            print(
                f"{peer.name:>18} {kind:>6}: ready {figures(peer.attach[kind])};  ADD {figures(peer.add[kind])}{ratio}"
            )
    for peer in peers:
        for kind in ("fresh", "reused"):
            for line in phase_table(peer, kind):
                print(line)
    if trace is not None:
        for line in rtnl_table(peers, holds):
            print(line)


if __name__ == "__main__":
    main()
