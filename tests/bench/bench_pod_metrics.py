#!/usr/bin/env python3
"""What the per-attachment series cost a scrape, at 0, 7 and 64 attachments.

The node is the host test fixtures (tests/support/hostnode.py): one PF of
``--vfs`` veth VFs, the real daemon behind the static shim, serving metrics
on loopback; its exporter reads the PF's VF counters from a file
(``FileVfStats``: a veth PF has none), logging each read.  Pods are added
one ADD at a time (CNI_ARGS naming them) up to each count, then the
daemon is scraped ``--scrapes`` times.  Printed per count: a scrape's median
time, the exporter's CPU per scrape, the series per scrape, the PF reads
per scrape (one whatever the count), and, in this process, the per-pod
collector alone on the same store (podmetrics.attachments) and the parsing
of a real-format PF answer with that many VFs' counters (the kernel's part
of the read is one RTM_GETLINK of the PF).  Asserts nothing.

    python3 tests/bench/bench_pod_metrics.py
    python3 tests/bench/bench_pod_metrics.py --counts 0,7,64 --scrapes 40
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from pyroute2.netlink.rtnl import RTM_NEWLINK  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg  # noqa: E402

from sriov_cni.daemon import metrics as podmetrics  # noqa: E402
from sriov_cni.kernel import vfcontrol  # noqa: E402
from tests.support.daemonlib import Daemon, exporter_of  # noqa: E402
from tests.support.fakes import FileVfStats  # noqa: E402
from tests.support.hostnode import bench_node  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def pf_answer(vfs: int) -> bytes:
    """A PF's RTM_NEWLINK answer with ``vfs`` VFs' MAC, settings and counters, as pyroute2 encodes it."""
    infos = []
    for vf in range(vfs):
        stats = [[f"IFLA_VF_STATS_{n.upper()}", vf * 1000 + i] for i, n in enumerate(vfcontrol._STATS.values())]
        attrs = [
            ["IFLA_VF_MAC", {"vf": vf, "mac": f"02:00:00:00:{vf >> 8:02x}:{vf & 0xFF:02x}"}],
            ["IFLA_VF_VLAN", {"vf": vf, "vlan": 0, "qos": 0}],
            ["IFLA_VF_RATE", {"vf": vf, "min_tx_rate": 0, "max_tx_rate": 0}],
            ["IFLA_VF_SPOOFCHK", {"vf": vf, "spoofchk": 1}],
            ["IFLA_VF_LINK_STATE", {"vf": vf, "link_state": 0}],
            ["IFLA_VF_TRUST", {"vf": vf, "trust": 0}],
            ["IFLA_VF_STATS", {"attrs": stats}],
        ]
        infos.append(["IFLA_VF_INFO", {"attrs": attrs}])
    msg = ifinfmsg()
    msg["header"]["type"] = RTM_NEWLINK
    msg["attrs"] = [["IFLA_IFNAME", "pf0"], ["IFLA_VFINFO_LIST", {"attrs": infos}]]
    msg.encode()
    return bytes(msg.data)


def timed(func: object, times: int) -> float:
    """Median seconds of ``times`` calls of ``func``."""
    assert callable(func)
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        func()
        spent.append(time.perf_counter() - start)
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="0,7,64", help="attachments to measure at, ascending")
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]

    with bench_node("podmetrics", max(counts), ()) as bench:
        state = bench.work / "state"
        stats, log = bench.work / "vfstats.json", bench.work / "vfstats.log"
        pf = bench.node.node.pfs[0].name
        stats.write_text(json.dumps({pf: {str(i): {"rx_bytes": i, "tx_bytes": i} for i in range(max(counts))}}))
        daemon = Daemon(
            bench.work / "run",
            "metrics=127.0.0.1:0",
            f"data={state}",
            f"vfstats={stats}",
            f"vfstats_log={log}",
            program=bench.node.daemon_command,
        )
        rows = []
        try:
            url = daemon.banner.split("metrics on ")[1].strip()
            exporter = exporter_of(daemon.proc.pid)
            conf = json.dumps(
                {"cniVersion": "1.0.0", "name": "bench", "type": "sriov", "pfNames": [pf], "dataDir": str(state)}
            ).encode()
            added = 0

            def scrape() -> str:
                with urllib.request.urlopen(url, timeout=30) as answer:
                    return str(answer.read().decode())

            for count in counts:
                while added < count:
                    env = {
                        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                        "CNI_COMMAND": "ADD",
                        "CNI_CONTAINERID": f"bench{added}",
                        "CNI_NETNS": bench.pods[added],
                        "CNI_IFNAME": "net1",
                        "CNI_PATH": "/usr/lib/cni",
                        "CNI_ARGS": f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{added}",
                        "SRIOV_CNI_SOCKET": str(daemon.socket),
                    }
                    done = subprocess.run(
                        [str(bench.bindir / "sriov")], input=conf, env=env, capture_output=True, timeout=120
                    )
                    if done.returncode != 0:
                        raise SystemExit(f"ADD failed: {done.stdout.decode()}")
                    added += 1
                scrape()  # warm
                log.write_text("")
                cpu = cpu_seconds(exporter)
                median = timed(scrape, args.scrapes)
                cpu = (cpu_seconds(exporter) - cpu) / args.scrapes
                reads = len(log.read_text().split()) / args.scrapes
                text = scrape()
                series = sum(1 for line in text.splitlines() if line.startswith("sriov_cni_pod_"))
                sources = podmetrics.Sources(lambda: FileVfStats(stats), lambda: None)
                collect = functools.partial(podmetrics.attachments, bench.node.node.sys, state, sources)
                alone = timed(lambda collect=collect: list(collect()), args.scrapes)
                answer = pf_answer(count)
                parse = timed(functools.partial(vfcontrol.vf_stats, answer), args.scrapes) if count else 0.0
                rows.append((count, median, cpu, series, reads, alone, parse, len(answer)))
        finally:
            daemon.stop()

    print(f"a scrape, median of {args.scrapes}, one PF:")
    for count, median, cpu, series, reads, alone, parse, size in rows:
        print(
            f"  {count:3} attachments: {median * 1000:6.1f} ms a scrape, exporter CPU {cpu * 1000:5.1f} ms; "
            f"{series:4} per-pod series; {reads:.1f} PF reads a scrape; per-pod collector alone "
            f"{alone * 1000:5.2f} ms; parsing a {size}-byte {count}-VF PF answer {parse * 1e6:6.0f} us"
        )


if __name__ == "__main__":
    main()
