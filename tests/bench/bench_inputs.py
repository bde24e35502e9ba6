#!/usr/bin/env python3
"""How the cost of one call grows with what it is given: IPAM ranges, and a call's environment.

Ranges: ADD+DEL of one attachment on a network of 1, 100, 1 000 and 10 000
/30 ranges, all in one range set (an address from the first free range) and
as as many range sets (an address from each): ``sriov-ipam`` in process (as
the sriov plugin runs it) and through the shim and the daemon, beside Go
``host-local`` executed on the same ranges.  host-local is run at a size
only while its cycle at the size before took under HOST_LOCAL_CAP seconds
(its time grows with the square of the ranges).

Environment: ADD+DEL of ``sriov-ipam`` through the shim and the daemon with
10 to 100 000 environment entries beside the CNI ones (up to 889 KB, under
the 1 MiB the daemon accepts), beside host-local executed with the same
environment: handing the environment to a new process costs both the same.

For each size: the median time of a cycle, its growth against the smallest
size, and that growth divided by the input's (1 or less: the time grows no
faster than the input); and "step", the growth from the size before divided
by the input's (about 1 or less when linear, about 10 per tenfold step when
the time grows with the input's square).  Needs root and the shim (``make -C shim``); prints
figures, asserts nothing.  ``python3 tests/bench/bench_inputs.py``
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import install  # noqa: E402
from tests.bench.bench_ipam import HOST_LOCAL, exec_call, in_process_call  # noqa: E402
from tests.support import daemonlib  # noqa: E402

RANGES = (1, 100, 1000, 10_000)
ENTRIES = (10, 100, 1000, 10_000, 100_000)
HOST_LOCAL_CAP = 2.0

Cycle = Callable[[str], None]


def slash30s(n: int) -> list[dict[str, str]]:
    base = int(ipaddress.ip_address("10.0.0.0"))
    return [{"subnet": f"{ipaddress.ip_address(base + 4 * i)}/30"} for i in range(n)]


def network(data_dir: Path, name: str, ranges: list[list[dict[str, str]]]) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "type": "sriov",
        "ipam": {"type": "sriov-ipam", "dataDir": str(data_dir), "ranges": ranges},
    }


def as_host_local(conf: dict[str, Any]) -> bytes:
    return json.dumps({**conf, "ipam": {**conf["ipam"], "type": "host-local"}}).encode()


def through_daemon(shim: Path, sock: Path, conf: bytes, extra: dict[str, str] | None = None) -> Cycle:
    def cycle(cid: str) -> None:
        for command in ("ADD", "DEL"):
            exec_call(shim, command, conf, cid, {"SRIOV_CNI_SOCKET": str(sock), **(extra or {})})

    return cycle


def executed(conf: bytes, extra: dict[str, str] | None = None) -> Cycle:
    def cycle(cid: str) -> None:
        for command in ("ADD", "DEL"):
            exec_call(HOST_LOCAL, command, conf, cid, extra)

    return cycle


def in_process(conf: bytes) -> Cycle:
    def cycle(cid: str) -> None:
        for command in ("ADD", "DEL"):
            in_process_call(command, conf, cid)

    return cycle


def median_seconds(cycle: Cycle, runs: int, tag: str) -> float:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        cycle(f"{tag}-{i}")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(unit: str, sizes: tuple[int, ...], results: dict[str, dict[int, float | str]]) -> list[str]:
    """Per peer: ms per cycle; its growth against the smallest size, and that divided by the input's;
    and the growth from the size before divided by the input's (about 1 or less: linear; 10 per
    tenfold step: the square)."""
    width = 38
    head = f"{unit:>8}" + "".join(f" | {name:^{width}}" for name in results)
    sub = f"{'':>8}" + "".join(f" | {'ms':>10} {'growth':>9} {'/input':>8} {'step':>8}" for _ in results)
    lines = [head, sub]
    for at, n in enumerate(sizes):
        row = f"{n:>8}"
        for by_size in results.values():
            t, first = by_size.get(n), by_size.get(sizes[0])
            before = by_size.get(sizes[at - 1]) if at else None
            if isinstance(t, float) and isinstance(first, float):
                growth = t / first
                step = f"{t / before / (n / sizes[at - 1]):8.3f}" if isinstance(before, float) else f"{'':8}"
                row += f" | {t * 1000:>10.1f} {growth:>9.2f} {growth / (n / sizes[0]):>8.3f} {step}"
            else:
                row += f" | {t or 'not run'!s:>{width}}"
        lines.append(row)
    return lines


def ranges_part(work: Path, shim: Path, sock: Path, shape: str, runs: int) -> list[str]:
    results: dict[str, dict[int, float | str]] = {"sriov-ipam in process": {}, "sriov-ipam, shim + daemon": {}}
    results["host-local exec"] = {}
    host_local_last: tuple[int, float] | None = None
    for n in RANGES:
        ranges = slash30s(n)
        sets = [ranges] if shape == "one range set" else [[r] for r in ranges]
        conf = network(work / "ipam", f"r{n}-{len(sets)}", sets)
        raw = json.dumps(conf).encode()
        reps = runs if n < 10_000 else max(1, runs // 2)
        results["sriov-ipam in process"][n] = median_seconds(in_process(raw), reps, f"in-{n}")
        results["sriov-ipam, shim + daemon"][n] = median_seconds(through_daemon(shim, sock, raw), reps, f"d-{n}")
        if host_local_last is None or host_local_last[1] < HOST_LOCAL_CAP:
            t = median_seconds(executed(as_host_local(conf)), reps if n < 1000 else 1, f"hl-{n}")
            results["host-local exec"][n] = t
            host_local_last = (n, t)
        else:
            results["host-local exec"][n] = f"not run ({host_local_last[1]:.1f} s at {host_local_last[0]})"
        print(f"  {shape}, {n} ranges done", file=sys.stderr, flush=True)
    return table("ranges", RANGES, results)


def environment_part(work: Path, shim: Path, sock: Path, runs: int) -> list[str]:
    conf = network(work / "ipam", "env", [[{"subnet": "10.99.0.0/24"}]])
    raw = json.dumps(conf).encode()
    results: dict[str, dict[int, float | str]] = {"sriov-ipam, shim + daemon": {}, "host-local exec": {}}
    for n in ENTRIES:
        # Short entries, as the 100 000 (889 KB) were.
        extra = {f"E{i}": "x" for i in range(n)}
        results["sriov-ipam, shim + daemon"][n] = median_seconds(through_daemon(shim, sock, raw, extra), runs, f"e{n}")
        results["host-local exec"][n] = median_seconds(executed(as_host_local(conf), extra), runs, f"he{n}")
        print(f"  environment of {n} entries done", file=sys.stderr, flush=True)
    return table("entries", ENTRIES, results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cycles per size (fewer at the largest)")
    parser.add_argument("--skip", action="append", default=[], choices=("ranges", "environment"))
    args = parser.parse_args()
    if not HOST_LOCAL.exists():
        sys.exit(f"{HOST_LOCAL} is missing: apt-get install -y containernetworking-plugins")
    if not daemonlib.SHIM.exists():
        sys.exit(f"{daemonlib.SHIM} is missing: make -C shim")
    report: list[str] = [f"CPUs: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}"]
    with tempfile.TemporaryDirectory(prefix="bench-inputs-") as tmp:
        work = Path(tmp)
        install.install(str(work / "bin"))
        shim = work / "bin" / "sriov-ipam"
        daemon = daemonlib.Daemon(work / "run", env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
        try:
            if "ranges" not in args.skip:
                for shape in ("one range set", "range sets of one range"):
                    lines = ranges_part(work, shim, daemon.socket, shape, args.runs)
                    report += ["", f"== ADD+DEL, /30 ranges in {shape}", *lines]
                    print("\n".join(report[-len(lines) - 2 :]), flush=True)
            if "environment" not in args.skip:
                lines = environment_part(work, shim, daemon.socket, args.runs)
                report += ["", "== ADD+DEL with a large environment (a /24, one range)", *lines]
                print("\n".join(report[-len(lines) - 2 :]), flush=True)
        finally:
            daemon.stop()
    print("\n".join(["", "==== summary", *report]))


if __name__ == "__main__":
    main()
