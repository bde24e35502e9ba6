#!/usr/bin/env python3
"""What DEL's restore costs: a pod that changed nothing, one that changed several items, this tree against another.

Each DEL is timed in process (the plugin's ``commands.run``, as the daemon's
child runs it) on the host fixtures: a veth end as the VF netdev in a
temporary sysfs, the PF side faked.  ``--baseline REV`` also measures the
tree at REV (a git revision, exported to a temporary directory), and the Go
``host-device`` plugin's DEL of the same veth is the peer; all three run in
turns in the same run, so their ratios hold on a slow or loaded machine.
The pod's changes are made between ADD and DEL and are not timed.  The
ethtool reading this tree's DEL adds is timed on its own too, beside one
netlink reading of the same link.  Needs
root; prints figures, asserts nothing.

    python3 tests/bench/bench_restore.py --baseline ff8bc55 --rounds 5 --cycles 20
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOST_DEVICE = Path("/usr/lib/cni/host-device")
# What the "changed" pod does to its interface: an altname, link settings, offloads.
CHANGES = (
    ("ip", "link", "property", "add", "dev", "net1", "altname", "benchalt"),
    ("ip", "link", "set", "dev", "net1", "mtu", "1400", "promisc", "on", "txqueuelen", "77", "alias", "pod"),
    ("ethtool", "-K", "net1", "tso", "off"),
)


def worker(cycles: int, changed: bool) -> None:
    """Time ``cycles`` DELs with the ``sriov_cni`` on sys.path; print their times in ms as JSON."""
    sys.path.insert(0, os.getcwd())
    from tests.support.pluginlib import Node

    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp))
        try:
            node.add_pf(1)
            conf = node.conf()
            times = []
            for _ in range(cycles):
                pod = node.pod()
                node.add(conf, netns=pod, ifname="net1")
                if changed:
                    for cmd in CHANGES:
                        subprocess.run(["ip", "netns", "exec", os.path.basename(pod), *cmd], check=True)
                start = time.perf_counter()
                res = node.cni("DEL", conf, netns=pod, ifname="net1")
                times.append((time.perf_counter() - start) * 1000)
                assert res.rc == 0, res.stdout
                subprocess.run(["ip", "netns", "del", os.path.basename(pod)], check=True)
                node.pods.remove(pod)
            print(json.dumps(times))
        finally:
            node.cleanup()


def host_device(cycles: int) -> list[float]:
    """The Go host-device plugin's DEL of a veth it moved into a pod, in ms."""
    times = []
    subprocess.run(["ip", "link", "add", "bhdev0", "type", "veth", "peer", "name", "bhdev0p"], check=True)
    try:
        for n in range(cycles):
            ns = f"bhdev-{os.getpid()}-{n}"
            subprocess.run(["ip", "netns", "add", ns], check=True)
            conf = json.dumps({"cniVersion": "1.0.0", "name": "b", "type": "host-device", "device": "bhdev0"})
            env = {
                "CNI_CONTAINERID": "b",
                "CNI_NETNS": f"/var/run/netns/{ns}",
                "CNI_IFNAME": "net1",
                "CNI_PATH": str(HOST_DEVICE.parent),
                "PATH": os.environ["PATH"],
            }
            add = dict(env, CNI_COMMAND="ADD")
            subprocess.run([str(HOST_DEVICE)], input=conf, env=add, text=True, capture_output=True, check=True)
            start = time.perf_counter()
            delete = dict(env, CNI_COMMAND="DEL")
            subprocess.run([str(HOST_DEVICE)], input=conf, env=delete, text=True, capture_output=True, check=True)
            times.append((time.perf_counter() - start) * 1000)
            subprocess.run(["ip", "netns", "del", ns], check=True)
    finally:
        subprocess.run(["ip", "link", "del", "bhdev0"], check=False)
    return times


def readings(n: int = 500) -> tuple[float, float]:
    """What DEL's comparison reads, in µs: the ethtool reading this tree adds, and one link reading beside it."""
    sys.path.insert(0, str(ROOT))
    from sriov_cni.kernel import ethtool, netlink

    subprocess.run(["ip", "link", "add", "bread0", "type", "veth", "peer", "name", "bread0p"], check=True)
    try:
        recorded = ethtool.read("bread0")
        start = time.perf_counter()
        for _ in range(n):
            ethtool.restore("bread0", recorded)  # nothing differs: its reading only
        eth = (time.perf_counter() - start) / n * 1e6
        with netlink.open_namespace() as host:
            start = time.perf_counter()
            for _ in range(n):
                host.find("bread0")
            link = (time.perf_counter() - start) / n * 1e6
    finally:
        subprocess.run(["ip", "link", "del", "bread0"], check=False)
    return eth, link


def measure(tree: Path, cycles: int, changed: bool) -> list[float]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(cycles)] + (["--changed"] if changed else [])
    out = subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"worker in {tree} failed: {out.stderr[-2000:]}")
    times: list[float] = json.loads(out.stdout.splitlines()[-1])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="a git revision to measure too")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--changed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.changed)
        return
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline], capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            trees[f"baseline {args.baseline}"] = base
        results: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                for changed in (False, True):
                    key = f"{name}, pod changed {'several items' if changed else 'nothing'}"
                    results.setdefault(key, []).extend(measure(tree, args.cycles, changed))
            if HOST_DEVICE.exists():
                results.setdefault("host-device (Go)", []).extend(host_device(args.cycles))
    eth, link = readings()
    go = statistics.median(results["host-device (Go)"]) if "host-device (Go)" in results else None
    print(f"DEL, median of {args.rounds} x {args.cycles} (ms); in process, host fixtures")
    for key, times in results.items():
        med = statistics.median(times)
        ratio = f"  {med / go:.2f} x host-device" if go else ""
        print(f"  {key:50s} {med:7.2f}{ratio}")
    print(f"the ethtool reading DEL compares: {eth:.0f} µs (one link reading: {link:.0f} µs, same run)")


if __name__ == "__main__":
    main()
