#!/usr/bin/env python3
"""Benchmark sriov-ipam against Debian's host-local on the same machine.

Prints, for both tools:

* allocations per second with 1, 8 and 64 concurrent clients, each client
  executing the IPAM binary once per allocation as a runtime does (and, for
  sriov-ipam, also calling the handlers in-process as the sriov plugin does);
* the cost of one allocation in a /16 prefilled to 1 % and to 99 %, and the
  ratio between the two.

The store is prefilled by writing reservation files directly, at random
addresses (as churn leaves a pool), with the round-robin position at a
random address.  Run as root: ``python3 tests/bench/bench_ipam.py``.
"""

from __future__ import annotations

import argparse
import io
import ipaddress
import json
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sriov_cni.cni import dispatch  # noqa: E402
from sriov_cni.ipam.main import HANDLERS  # noqa: E402  (needs the path set above)

OURS = REPO / "bin" / "sriov-ipam"
HOST_LOCAL = Path("/usr/lib/cni/host-local")
NETWORK = "bench"
SUBNET = ipaddress.ip_network("10.20.0.0/16")


def netconf(data_dir: Path, ipam_type: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "sriov",
        "ipam": {"type": ipam_type, "dataDir": str(data_dir), "ranges": [[{"subnet": str(SUBNET)}]]},
    }


def env(command: str, cid: str) -> dict[str, str]:
    return {
        **os.environ,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/var/run/netns/bench",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(HOST_LOCAL.parent),
    }


def exec_call(binary: Path, command: str, conf: bytes, cid: str, extra: dict[str, str] | None = None) -> None:
    """Run the IPAM executable once; ``extra``: more environment."""
    proc = subprocess.run([str(binary)], input=conf, env={**env(command, cid), **(extra or {})}, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary.name} {command} {cid} failed: {proc.stdout.decode()}{proc.stderr.decode()}")


def exec_add(binary: Path, conf: bytes, cid: str) -> None:
    exec_call(binary, "ADD", conf, cid)


def in_process_call(command: str, conf: bytes, cid: str) -> None:
    out = io.StringIO()
    if dispatch(HANDLERS, env(command, cid), conf, out, io.StringIO(), "bench") != 0:
        raise RuntimeError(f"in-process {command} {cid} failed: {out.getvalue()}")


def in_process_add(conf: bytes, cid: str) -> None:
    in_process_call("ADD", conf, cid)


def _in_process_worker(args: tuple[bytes, list[str]]) -> None:
    conf, cids = args
    for cid in cids:
        in_process_add(conf, cid)


def throughput(data_dir: Path, clients: int, total: int, how: str) -> float:
    """Allocations per second with ``clients`` concurrent clients on a fresh store."""
    shutil.rmtree(data_dir, ignore_errors=True)
    binary = HOST_LOCAL if how == "host-local" else OURS
    conf = json.dumps(netconf(data_dir, binary.name)).encode()
    cids = [f"tp-{clients}-{i}" for i in range(total)]
    start = time.perf_counter()
    if how == "in-process":
        # Separate processes, so the clients really contend on the flock.
        chunks = [(conf, cids[i::clients]) for i in range(clients)]
        with multiprocessing.get_context("fork").Pool(clients) as pool:
            pool.map(_in_process_worker, chunks)
    else:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda cid: exec_add(binary, conf, cid), cids))
    elapsed = time.perf_counter() - start
    reserved = sum(1 for p in (data_dir / NETWORK).iterdir() if p.name.startswith("10."))
    if reserved != total:
        raise RuntimeError(f"{how}: {reserved} reservations after {total} ADDs")
    return total / elapsed


def prefill(data_dir: Path, fraction: float, seed: int) -> None:
    """Reserve ``fraction`` of the /16 at random addresses, as host-local would have."""
    shutil.rmtree(data_dir, ignore_errors=True)
    net = data_dir / NETWORK
    net.mkdir(parents=True)
    gateway = SUBNET.network_address + 1
    usable = [ip for ip in SUBNET.hosts() if ip != gateway]
    rng = random.Random(seed)
    for i, ip in enumerate(rng.sample(usable, int(len(usable) * fraction))):
        fd = os.open(net / str(ip), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, f"prefill-{i}\r\neth0".encode())
        os.close(fd)
    (net / "last_reserved_ip.0").write_text(str(rng.choice(usable)))


def cost(data_dir: Path, fraction: float, runs: int, add: Callable[[bytes, str], None], ipam_type: str) -> float:
    """Median seconds of one ADD into a pool prefilled to ``fraction``."""
    prefill(data_dir, fraction, seed=int(fraction * 1000))
    conf = json.dumps(netconf(data_dir, ipam_type)).encode()
    times = []
    for i in range(runs):
        start = time.perf_counter()
        add(conf, f"cost-{i}")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=256, help="allocations per throughput run")
    args = parser.parse_args()
    if not HOST_LOCAL.exists():
        sys.exit(f"{HOST_LOCAL} is missing: apt-get install -y containernetworking-plugins")
    with tempfile.TemporaryDirectory(prefix="bench-ipam-") as tmp:
        data_dir = Path(tmp) / "networks"
        print(f"CPUs: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}")
        print(f"\nAllocations per second into a fresh {SUBNET} ({args.total} ADDs per run)")
        print(
            f"{'clients':>8} {'sriov-ipam exec':>16} {'host-local exec':>16} {'ratio':>6} {'sriov-ipam in-process':>22}"
        )
        for clients in (1, 8, 64):
            ours = throughput(data_dir, clients, args.total, "exec")
            theirs = throughput(data_dir, clients, args.total, "host-local")
            inproc = throughput(data_dir, clients, args.total, "in-process")
            print(f"{clients:>8} {ours:>16.1f} {theirs:>16.1f} {ours / theirs:>6.2f} {inproc:>22.1f}")

        print(f"\nCost of one ADD (median) in {SUBNET} prefilled at random addresses")
        rows = [
            ("sriov-ipam in-process", in_process_add, "sriov-ipam", 200, 200),
            ("sriov-ipam exec", lambda c, i: exec_add(OURS, c, i), "sriov-ipam", 30, 30),
            ("host-local exec", lambda c, i: exec_add(HOST_LOCAL, c, i), "host-local", 30, 5),
        ]
        print(f"{'':>22} {'1% full':>10} {'99% full':>10} {'99%/1%':>7}")
        results = {}
        for name, add, ipam_type, runs_low, runs_high in rows:
            low = cost(data_dir, 0.01, runs_low, add, ipam_type)
            high = cost(data_dir, 0.99, runs_high, add, ipam_type)
            results[name] = high
            print(f"{name:>22} {low * 1000:>8.2f}ms {high * 1000:>8.2f}ms {high / low:>7.2f}")
        print(
            f"\nAt 99% full host-local's ADD costs {results['host-local exec'] / results['sriov-ipam exec']:.1f}x "
            "sriov-ipam's (both exec)"
        )


if __name__ == "__main__":
    main()
