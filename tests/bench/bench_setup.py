#!/usr/bin/env python3
"""How much time ``sriov-cni setup`` adds beyond the kernel's own VF creation.

For every SR-IOV PF given (default: every igb PF of the rig's guest), each
round measures, from 0 VFs:

* bare: ``sriov_numvfs`` 0 -> N on each PF in turn, waiting until every VF
  has its netdev (what any tool must wait for);
* setup: the same change through ``sriov-cni setup`` in-process (plan and
  execute, with IRQ/RPS/XPS tuning), and through ``bin/sriov-cni`` as a
  process (adding interpreter start-up and imports);

and prints the medians and the overhead (setup minus bare).  Run as root in
the guest::

    python3 tests/vm/rig.py -- python3 tests/bench/bench_setup.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sriov_cni.kernel import sysfs  # noqa: E402  (needs the path set above)
from sriov_cni.node import config as node_config  # noqa: E402
from sriov_cni.node import setup as node_setup  # noqa: E402
from sriov_cni.node import vfs  # noqa: E402
from sriov_cni.paths import Paths  # noqa: E402

SYS = Paths().sys


def igb_pfs() -> list[str]:
    net = SYS / "class" / "net"
    return sorted(
        p.name
        for p in net.iterdir()
        if (p / "device" / "sriov_totalvfs").exists() and (p / "device" / "driver").resolve().name == "igb"
    )


def reset(pcis: list[str]) -> None:
    for pci in pcis:
        if sysfs.numvfs(SYS, pci):
            sysfs.write(sysfs.pci_dir(SYS, pci) / "sriov_numvfs", "0")
        vfs.wait_for_vfs(SYS, pci, 0, want_netdevs=False)
    # VF removal finishes asynchronously; wait until no virtfn link is left.
    deadline = time.monotonic() + 30
    while any(sysfs.vf_pcis(SYS, pci) for pci in pcis) and time.monotonic() < deadline:
        time.sleep(0.01)


def bare(pcis: list[str], count: int) -> float:
    start = time.perf_counter()
    for pci in pcis:
        sysfs.write(sysfs.pci_dir(SYS, pci) / "sriov_numvfs", str(count))
        vfs.wait_for_vfs(SYS, pci, count, want_netdevs=True)
    return time.perf_counter() - start


def in_process(config: node_config.NodeConfig, data: Path, state: Path) -> float:
    start = time.perf_counter()
    paths = Paths(state_file=state)
    plan = node_setup.plan(config, paths, data, node_setup.NetlinkLinks())
    node_setup.execute(plan, paths, lambda line: None)
    return time.perf_counter() - start


def as_process(config_file: Path, data: Path, state: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bin" / "sriov-cni"),
            "setup",
            "--config",
            str(config_file),
            "--data-dir",
            str(data),
            "--state-file",
            str(state),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pf", action="append", help="PF netdev (repeatable; default: every igb PF)")
    parser.add_argument("--vfs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pfs = args.pf or igb_pfs()
    pcis = [sysfs.resolve_pf(SYS, pf).pci for pf in pfs]
    text = "pfs:\n" + "".join(
        f"  - {{pf: {pf}, numVfs: {args.vfs}, tuning: {{rps: true, xps: true, rfsFlowEntries: 32768}}}}\n" for pf in pfs
    )
    config = node_config.parse(text)
    times: dict[str, list[float]] = {"bare": [], "setup": [], "process": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config_file = work / "node.yaml"
        config_file.write_text(text)
        # The PFs up first, as setup leaves them: igb re-requests its
        # vectors on the VF change either way, and bare must not pay for
        # the first link-up alone.
        for pf in pfs:
            subprocess.run(["ip", "link", "set", pf, "up"], check=True)
        try:
            for _ in range(args.rounds):
                reset(pcis)
                times["bare"].append(bare(pcis, args.vfs))
                reset(pcis)
                times["setup"].append(in_process(config, work / "data", work / "state.json"))
                reset(pcis)
                times["process"].append(as_process(config_file, work / "data", work / "state.json"))
        finally:
            reset(pcis)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{len(pfs)} PFs x {args.vfs} VFs with IRQ/RPS/XPS/RFS tuning, median of {args.rounds} rounds")
    print(f"  bare sriov_numvfs write + wait for netdevs: {med['bare'] * 1000:8.1f} ms")
    print(
        f"  sriov-cni setup, in-process:               {med['setup'] * 1000:8.1f} ms   overhead {(med['setup'] - med['bare']) * 1000:+.1f} ms"
    )
    print(
        f"  bin/sriov-cni setup, as a process:         {med['process'] * 1000:8.1f} ms   overhead {(med['process'] - med['bare']) * 1000:+.1f} ms"
    )
    print("  rounds (ms): " + "; ".join(f"{k} " + " ".join(f"{t * 1000:.0f}" for t in v) for k, v in times.items()))


if __name__ == "__main__":
    main()
