#!/usr/bin/env python3
"""What scraping the daemon's metrics costs its calls, and what a scrape costs.

The node is the host test fixtures (tests/support/hostnode.py): one PF of
``--vfs`` veth VFs, the real daemon behind the static shim, serving metrics
on loopback.  ADD+DEL pairs of one pod run one after another, in rounds that
alternate between nobody scraping, a scraper (a process of its own) fetching
/metrics every second, and one fetching it back to back, so that a shared
machine's slow spells fall on all three.  Printed: the median ADD+DEL in
each and its ratio to the first; the scrapes served meanwhile; and, with no
call running, a scrape's median time and the CPU it takes in the daemon (its
exposition) and in the exporter (HTTP, the pool read with status' code,
parsing the daemon's text).  Asserts nothing.

    python3 tests/bench/bench_metrics.py
    python3 tests/bench/bench_metrics.py --vfs 64 --rounds 10 --pairs 10
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
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import install  # noqa: E402
from tests.support.daemonlib import Daemon, exporter_of  # noqa: E402
from tests.support.hostnode import HostNode  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
# Seconds between scrapes; None: no scraper.
MODES: dict[str, float | None] = {"no scraper": None, "a scrape every second": 1.0, "scrapes back to back": 0.0}
# Scrapes URL every INTERVAL seconds until terminated, then prints how many it made.
SCRAPER = """
import signal, sys, time, urllib.request
done = 0
def end(*_):
    print(done)
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
while True:
    with urllib.request.urlopen(sys.argv[1], timeout=30) as answer:
        answer.read()
    done += 1
    time.sleep(float(sys.argv[2]))
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vfs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each kind, alternating")
    parser.add_argument("--pairs", type=int, default=8, help="ADD+DEL pairs per round")
    parser.add_argument("--scrapes", type=int, default=50, help="scrapes timed with no call running")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        work = Path(tmp)
        node = HostNode(work / "node", 1, args.vfs)
        pod = node.node.pod()
        shim = work / "bin" / "sriov"
        shim.parent.mkdir()
        shim.symlink_to(install.SHIM)
        sock = work / "run" / "plugin.sock"
        state = work / "state"
        daemon = Daemon(sock.parent, "metrics=127.0.0.1:0", f"data={state}", program=node.daemon_command)
        try:
            url = daemon.banner.split("metrics on ")[1].strip()
            conf = json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "bench",
                    "type": "sriov",
                    "pfNames": [node.node.pfs[0].name],
                    "dataDir": str(state),
                }
            ).encode()
            env = {
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "CNI_CONTAINERID": "bench",
                "CNI_NETNS": pod,
                "CNI_IFNAME": "net1",
                "CNI_PATH": "/usr/lib/cni",
                "SRIOV_CNI_SOCKET": str(sock),
            }

            def scrape() -> None:
                with urllib.request.urlopen(url, timeout=30) as answer:
                    answer.read()

            def pair() -> float:
                start = time.perf_counter()
                for command in ("ADD", "DEL"):
                    done = subprocess.run(
                        [str(shim)], input=conf, env=dict(env, CNI_COMMAND=command), capture_output=True, timeout=120
                    )
                    if done.returncode != 0:
                        raise SystemExit(f"{command} failed: {done.stdout.decode()}")
                return time.perf_counter() - start

            pair()  # warm the children
            pairs: dict[str, list[float]] = {mode: [] for mode in MODES}
            scrapes = dict.fromkeys(MODES, 0)
            for _ in range(args.rounds):
                for mode, interval in MODES.items():
                    scraper = (
                        None
                        if interval is None
                        else subprocess.Popen(
                            [sys.executable, "-c", SCRAPER, url, str(interval)], stdout=subprocess.PIPE, text=True
                        )
                    )
                    pairs[mode] += [pair() for _ in range(args.pairs)]
                    if scraper is not None:
                        scraper.terminate()
                        out, _ = scraper.communicate(timeout=60)
                        scrapes[mode] += int(out or 0)

            exporter = exporter_of(daemon.proc.pid)
            times = []
            daemon_cpu, exporter_cpu = cpu_seconds(daemon.proc.pid), cpu_seconds(exporter)
            for _ in range(args.scrapes):
                start = time.perf_counter()
                scrape()
                times.append(time.perf_counter() - start)
            daemon_cpu = cpu_seconds(daemon.proc.pid) - daemon_cpu
            exporter_cpu = cpu_seconds(exporter) - exporter_cpu
        finally:
            daemon.stop()
            node.close()

    peer = statistics.median(pairs["no scraper"])
    print(f"ADD+DEL, {args.rounds * args.pairs} pairs each, {args.vfs} VFs:")
    for mode in MODES:
        median = statistics.median(pairs[mode])
        print(f"  {mode:24} {median * 1000:6.1f} ms  ratio {median / peer:.2f}  ({scrapes[mode]} scrapes meanwhile)")
    print(
        f"a scrape, {args.scrapes} with no call running: {statistics.median(times) * 1000:.1f} ms median; "
        f"CPU per scrape: daemon {daemon_cpu / args.scrapes * 1000:.2f} ms, "
        f"exporter {exporter_cpu / args.scrapes * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
