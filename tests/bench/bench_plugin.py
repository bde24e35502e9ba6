#!/usr/bin/env python3
"""ADD+DEL latency and peak memory of ``sriov`` against Go ``host-device``.

Both plugins take the same real VF through the same cycle (ADD into a pod
namespace, DEL back) with host-local IPAM, interleaved in one run, so the
ratio holds even on a slow or emulated machine.  ``sriov`` is measured as
a node without Python runs it (the static shim forwarding to the daemon),
as the Python executable through the daemon and in process (no daemon), and
with its in-process IPAM.  Needs root and an SR-IOV PF (inside the QEMU guest: the emulated
igb); prints figures, asserts nothing.

    python3 tests/vm/rig.py -- python3 tests/bench/bench_plugin.py
    python3 tests/bench/bench_plugin.py --pf ens1f0 --cycles 50   # a real node
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
sys.path.insert(0, str(ROOT))

from sriov_cni import client  # noqa: E402

GO_PLUGINS = Path("/usr/lib/cni")


def find_pf() -> str:
    for dev in sorted(Path("/sys/class/net").iterdir()):
        if (dev / "device" / "sriov_totalvfs").exists():
            return dev.name
    sys.exit("no SR-IOV PF found (is this the guest, or give --pf)")


def ensure_vf(pf: str) -> tuple[str, str]:
    """The PCI address and netdev of VF 0, creating VFs if there are none."""
    dev = Path("/sys/class/net") / pf / "device"
    subprocess.run(["ip", "link", "set", pf, "up"], check=True)
    if int((dev / "sriov_numvfs").read_text()) == 0:
        (dev / "sriov_numvfs").write_text("1")
    vf_pci = os.path.basename(os.readlink(dev / "virtfn0"))
    net = Path("/sys/bus/pci/devices") / vf_pci / "net"
    for _ in range(200):
        if net.exists() and os.listdir(net):
            return vf_pci, os.listdir(net)[0]
        time.sleep(0.05)
    sys.exit(f"VF {vf_pci} never got a netdev")


def invoke(exe: Path, command: str, conf: dict[str, object], env: dict[str, str]) -> tuple[float, int]:
    """Seconds and peak RSS (KiB) of one plugin process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(env, CNI_COMMAND=command),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(json.dumps(conf).encode())
    proc.stdin.close()
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{exe.name} {command} failed ({proc.returncode}): {out.decode()} {err.decode()[-500:]}")
    return elapsed, usage.ru_maxrss


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pf", help="SR-IOV PF netdev (default: the first found)")
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args()

    pf = args.pf or find_pf()
    vf_pci, vf_netdev = ensure_vf(pf)
    work = Path(tempfile.mkdtemp(prefix="sriov-bench-"))
    bindir = work / "bin"
    client.install(str(bindir), sys.executable)
    shimdir = work / "shim-bin"
    client.install(str(shimdir))
    for name in ("host-device", "host-local"):
        os.symlink(GO_PLUGINS / name, bindir / name)
    netns = "sriov-bench"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    sock = str(work / "run" / "plugin.sock")
    daemon = subprocess.Popen(
        [sys.executable, "-c", "from sriov_cni.cli import main; main()", "daemon", "--socket", sock],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    assert daemon.stderr is not None
    if "listening" not in daemon.stderr.readline():
        sys.exit("the sriov-cni daemon did not start")

    def ipam(kind: str) -> dict[str, object]:
        return {"type": kind, "subnet": "10.99.0.0/24", "dataDir": str(work / f"ipam-{kind}")}

    base_env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_CONTAINERID": "bench",
        "CNI_NETNS": f"/var/run/netns/{netns}",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bindir),
    }
    peers: dict[str, tuple[Path, dict[str, object], dict[str, str]]] = {
        "host-device (Go)": (
            bindir / "host-device",
            {"cniVersion": "1.0.0", "name": "bench", "type": "host-device", "device": vf_netdev, "ipam": ipam("host-local")},
            base_env,
        ),
        "sriov, shim + daemon": (
            shimdir / "sriov",
            {"cniVersion": "1.0.0", "name": "bench", "type": "sriov", "deviceID": vf_pci,
             "dataDir": str(work / "state"), "ipam": ipam("host-local")},
            dict(base_env, SRIOV_CNI_SOCKET=sock),
        ),
        "sriov, Python + daemon": (
            bindir / "sriov",
            {"cniVersion": "1.0.0", "name": "bench", "type": "sriov", "deviceID": vf_pci,
             "dataDir": str(work / "state"), "ipam": ipam("host-local")},
            dict(base_env, SRIOV_CNI_SOCKET=sock),
        ),
        "sriov, shim + sriov-ipam": (
            shimdir / "sriov",
            {"cniVersion": "1.0.0", "name": "bench", "type": "sriov", "deviceID": vf_pci,
             "dataDir": str(work / "state"), "ipam": ipam("sriov-ipam")},
            dict(base_env, SRIOV_CNI_SOCKET=sock),
        ),
        "sriov, in process": (
            bindir / "sriov",
            {"cniVersion": "1.0.0", "name": "bench", "type": "sriov", "deviceID": vf_pci,
             "dataDir": str(work / "state"), "ipam": ipam("host-local")},
            dict(base_env, SRIOV_CNI_SOCKET=str(work / "no-daemon.sock")),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in peers}
    rss: dict[str, int] = {name: 0 for name in peers}
    try:
        for _ in range(args.cycles):
            # Interleaved, so drift in machine speed hits every peer alike.
            for name, (exe, conf, env) in peers.items():
                t_add, r_add = invoke(exe, "ADD", conf, env)
                t_del, r_del = invoke(exe, "DEL", conf, env)
                times[name].append(t_add + t_del)
                rss[name] = max(rss[name], r_add, r_del)
        daemon_hwm = vm_hwm_kib(daemon.pid)
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["ip", "netns", "del", netns], check=False)

    go = statistics.median(times["host-device (Go)"])
    print(f"ADD+DEL cycles on VF {vf_pci} ({vf_netdev}) of {pf}, {args.cycles} each, host-local IPAM unless noted")
    print(f"{'plugin':30} {'median ms':>10} {'p90 ms':>8} {'ratio':>6} {'peak RSS MiB':>13}")
    for name, samples in times.items():
        med = statistics.median(samples)
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))]
        print(f"{name:30} {med * 1000:10.1f} {p90 * 1000:8.1f} {med / go:6.2f} {rss[name] / 1024:13.1f}")
    shim = statistics.median(times["sriov, shim + daemon"])
    print(f"shim + daemon / Go host-device: {shim / go:.2f} (same VF, host-local IPAM, this run)")
    print(f"daemon process peak RSS: {daemon_hwm / 1024:.1f} MiB (one per node, shared by every call)")


if __name__ == "__main__":
    main()
