#!/usr/bin/env python3
"""Pod readiness through the real runtimes: seconds from a pair's first pod start to traffic both ways.

The same measure as tests/bench/bench_attach.py, but the pods are started
by the runtimes users run, in the rig's igb guest:

* ``podman`` (the CNI backend, configured by deploy/podman/containers.conf):
  two containers, one ``podman run --detach`` after the other; the clock
  starts with the first ``podman run`` and stops when each container's
  network namespace has had a reply from the other;
* ``cri``: containerd's CRI plugin as kubelet drives it: two pod sandboxes,
  one RunPodSandbox after the other (the CNI ADD runs inside it); the clock
  starts with the first RunPodSandbox and stops the same way.

The pings (``ping -c 1 -W 1``, tried again until answered, at most
``--bound`` seconds) are sent from each pod's network namespace with the
node's ping (``nsenter``), once the runtime returned and the pod's address
was read with ``ip -j``; both count in the readiness.

For each runtime, two plugins in the same boot, interleaved round by round
(each first every other round), both on VFs created by a plain
``sriov_numvfs`` write with the PF up, ``--settle`` seconds before the
pair's first start (fresh), then on the same VFs after the pods were
removed (reused):

* ``sriov``: this checkout's daemon on the node's socket, called through
  the static shim ``sriov-cni install-cni`` writes, the chain of
  deploy/podman/10-sriov.conflist (sriov self-allocating from the PF and
  sriov-ipam, then tuning);
* ``host-device``: the Go reference plugin (``/usr/lib/cni/host-device``)
  with a fixed device per pod and static IPAM, then the same tuning.  Each
  pod has a network of its own, the only way either runtime gives a pod its
  own device: for podman a network per container, for the CRI the one
  conflist rewritten before each sandbox.  The time the CRI plugin takes to
  load the rewritten conflist is left out of the readiness (each pair's
  line says how much; for sriov it is only the check that its conflist is
  the one loaded).

Printed: each pair as it runs, then per (runtime, plugin, fresh/reused)
the median and maximum readiness, the duration of the runtime's own call
(``podman run --detach`` or RunPodSandbox); for sriov, what the daemon
measured (``SRIOV_CNI_DAEMON_STATS``) of the calls it ran during the pair:
the ADD inside each runtime call, and the other calls the runtime made of
it (podman asks the plugin its VERSION on each run: the shim passes that
on to the daemon too);
then sriov's medians over host-device's.  Two rounds take about 5 minutes in a
guest under TCG.  Needs root in the guest; prints figures, asserts nothing::

    python3 tests/vm/rig.py --pfs 1 -- python3 tests/bench/bench_runtime_ready.py --rounds 2
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sriov_cni.daemon import measure  # noqa: E402
from sriov_cni.daemon.client import DEFAULT_SOCKET  # noqa: E402
from tests.support.daemonlib import Daemon  # noqa: E402
from tests.vm.crilib import CRI_TIMEOUT, Containerd, containerd_cri, new_pod  # noqa: E402
from tests.vm.runtimelib import (  # noqa: E402
    IMAGE,
    Podman,
    PodmanHost,
    busybox_rootfs,
    cni_bin_dir,
    ipv4,
    mounted,
    pod_eth0,
    render_conflist,
    run,
    runtime_storage,
)
from tests.vm.vmlib import SYS_NET, Sriov, is_sriov_igb, wait_until  # noqa: E402

PAIR = 2
KINDS = ("fresh", "reused")
PLUGINS = ("sriov", "host-device")
RUNTIMES = ("podman", "cri")
# containerd_config's CNI directories, the node's.
CNI_BIN = Path("/opt/cni/bin")
CNI_CONF = Path("/etc/cni/net.d")
GO_PLUGINS = Path("/usr/lib/cni")


@dataclass
class Series:
    """One (runtime, plugin): readiness and the runtime call's seconds, fresh and reused."""

    ready: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    call: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    # sriov's ADD inside the runtime's call, as the daemon measured it.
    add: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    # The seconds of its other calls the runtime made of the daemon, per pod start.
    others: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})


@dataclass
class Pod:
    name: str
    id: str  # CNI_CONTAINERID: podman's container, the CRI's sandbox
    netns: str  # a path
    seconds: float  # the runtime's call
    # Seconds spent before the call that are not the runtime's own (the CRI
    # plugin loading host-device's rewritten conflist).
    aside: float = 0.0
    podman: Podman | None = None


class Runtime(Protocol):
    def start(self, vf: int, plugin: str, name: str) -> Pod: ...

    def remove(self, pods: list[Pod]) -> None: ...


def host_device_conflist(sriov: dict[str, Any], vf: int) -> dict[str, Any]:
    """The sriov chain with host-device first: VF ``vf``'s device (renamed hd<vf>) and a static address."""
    conf = copy.deepcopy(sriov)
    conf["name"] = f"hd-{vf}"
    conf["plugins"][0] = {
        "type": "host-device",
        "device": f"hd{vf}",
        "ipam": {"type": "static", "addresses": [{"address": f"10.67.0.{10 + vf}/24"}]},
    }
    return conf


class PodmanRuntime:
    """podman, its sriov network and one host-device network per VF, each in a directory of its own."""

    def __init__(self, base: Path, storage: Path, pf: str) -> None:
        host = PodmanHost(base, storage, CNI_BIN, pf)
        self.networks = {"sriov": host.network(host.conf)}
        for vf in range(PAIR):
            self.networks[f"host-device {vf}"] = host.network(host_device_conflist(host.conf, vf))
        self.networks["sriov"]("import", "--change", 'CMD ["/bin/sh"]', str(busybox_rootfs(base)), IMAGE)

    def start(self, vf: int, plugin: str, name: str) -> Pod:
        podman = self.networks[plugin if plugin == "sriov" else f"{plugin} {vf}"]
        before = Podman.namespaces()
        started = time.monotonic()
        out = podman("run", "--detach", "--network", podman.network, "--name", name, IMAGE, "sleep", "3600")
        seconds = time.monotonic() - started
        [netns] = Podman.namespaces() - before
        return Pod(name, out.stdout.split()[-1], netns, seconds, podman=podman)

    def remove(self, pods: list[Pod]) -> None:
        # Each with its own network's podman: another's does not know the
        # network, and would not run its DEL.
        for pod in pods:
            assert pod.podman is not None
            pod.podman("rm", "--force", "--time", "0", pod.name)


class CriRuntime:
    """containerd's CRI plugin, its one conflist in the node's directory."""

    def __init__(self, containerd: Containerd, logs: Path, pf: str, data: Path) -> None:
        self.cri = containerd.cri
        self.logs = logs
        self.sriov = render_conflist(pf, data)
        self.ids: dict[str, str] = {}

    def load(self, conf: dict[str, Any]) -> float:
        """Make ``conf`` the node's conflist; seconds until the CRI plugin has loaded it."""
        started = time.monotonic()
        if not self.loaded(conf["name"]):
            # Replaced whole: the plugin reloads on every change in the directory.
            staged = CNI_CONF / ".staged"
            staged.write_text(json.dumps(conf))
            os.replace(staged, CNI_CONF / "10-bench.conflist")
            wait_until(lambda: self.loaded(conf["name"]), CRI_TIMEOUT, f"containerd to load network {conf['name']}")
        return time.monotonic() - started

    def loaded(self, network: str) -> bool:
        return f'"Name":"{network}"' in self.cri.cni_config()

    def start(self, vf: int, plugin: str, name: str) -> Pod:
        aside = self.load(self.sriov if plugin == "sriov" else host_device_conflist(self.sriov, vf))
        started = time.monotonic()
        pod_id = self.cri.run_pod(new_pod(name, "default", self.logs))
        seconds = time.monotonic() - started
        self.ids[name] = pod_id
        return Pod(name, pod_id, self.cri.pod_netns(pod_id), seconds, aside)

    def remove(self, pods: list[Pod]) -> None:
        for pod in pods:
            pod_id = self.ids.pop(pod.name)
            self.cri.stop_pod(pod_id)
            self.cri.remove_pod(pod_id)


def both_ways(netns: list[str], addresses: list[str], bound: float) -> bool:
    """Whether each pod got a reply from the other within ``bound`` seconds."""
    deadline = time.monotonic() + bound
    done = [False, False]
    while not all(done):
        if time.monotonic() > deadline:
            return False
        for i in (0, 1):
            if not done[i]:
                ping = ["nsenter", f"--net={netns[i]}", "ping", "-c", "1", "-W", "1", addresses[1 - i]]
                done[i] = subprocess.run(ping, capture_output=True, check=False).returncode == 0
    return True


def daemon_calls(stats: Path, containers: list[str]) -> list[dict[str, Any]]:
    """The calls the daemon answered for a pair, once the ADDs for ``containers`` are among them.

    Each child writes its call's report just after answering; the directory
    was emptied before the pair's first start.  A DEL's report is the
    removal of the pods before, however late it comes.
    """
    deadline = time.monotonic() + CRI_TIMEOUT
    while time.monotonic() < deadline:
        reports = [json.loads(path.read_text()) for path in stats.glob("*.json")]
        reports = [r for r in reports if r["command"] != "DEL"]
        if {r["container"] for r in reports if (r["program"], r["command"]) == ("sriov", "ADD")} >= set(containers):
            return reports
        time.sleep(0.1)
    sys.exit(f"bench_runtime_ready: the daemon wrote no report of the ADDs for {containers}")


def sriov_calls(series: Series, kind: str, pods: list[Pod], stats: Path) -> str:
    """What the daemon ran during the pair: the ADDs, and the other calls the runtimes made of it."""
    reports = daemon_calls(stats, [pod.id for pod in pods])
    adds = {r["container"]: float(r["seconds"]) for r in reports if r["command"] == "ADD"}
    series.add[kind] += [adds[pod.id] for pod in pods]
    others: dict[str, list[float]] = {}
    for r in reports:
        if r["command"] != "ADD":
            others.setdefault(f"{r['program']} {r['command']}", []).append(float(r["seconds"]))
    series.others[kind] += [sum(map(sum, others.values())) / len(pods)]
    shown = ", ".join(f"{len(v)} {name} {sum(v):.1f} s" for name, v in sorted(others.items()))
    return f"; daemon: ADDs {', '.join(f'{adds[pod.id]:.1f}' for pod in pods)} s{'; ' + shown if shown else ''}"


def pair(runtime: Runtime, plugin: str, kind: str, tag: str, series: Series, stats: Path, bound: float) -> list[Pod]:
    """Two pods, one started after the other, timed to traffic both ways; returns them."""
    for report in stats.iterdir():
        report.unlink()
    first = time.monotonic()
    pods = [runtime.start(vf, plugin, f"{tag}{kind[0]}{vf}") for vf in range(PAIR)]
    addresses = [ipv4(pod_eth0(pod.netns)).split("/")[0] for pod in pods]
    answered = both_ways([pod.netns for pod in pods], addresses, bound)
    ready = time.monotonic() - first - sum(pod.aside for pod in pods)
    series.ready[kind].append(ready if answered else bound)
    series.call[kind] += [pod.seconds for pod in pods]
    calls = ", ".join(f"{pod.seconds:.1f}" for pod in pods) + " s"
    if plugin == "sriov":
        # Read once the clock stopped: the reports come after the answers.
        calls += sriov_calls(series, kind, pods, stats)
    shown = f"{ready:.1f} s after the first start" if answered else f"none within {bound:g} s"
    aside = sum(pod.aside for pod in pods)
    if aside >= 0.05:
        shown += f", {aside:.1f} s of conflist loading left out"
    print(f"  {tag} {plugin} {kind}: runtime calls {calls}; traffic both ways {shown}", flush=True)
    return pods


def round_(
    runtime: Runtime, name: str, plugin: str, pf: str, n: int, series: Series, stats: Path, args: argparse.Namespace
) -> None:
    vfs = Sriov([pf])
    # As a node without sriov-cni's setup creates them: the PF up, then a
    # plain sriov_numvfs write.
    netdevs = vfs.enable(pf, PAIR)
    if plugin == "host-device":
        # host-device's config names the device: a name that does not
        # depend on the order the kernel probed the VFs.
        for vf, netdev in enumerate(netdevs):
            run("ip", "link", "set", netdev, "name", f"hd{vf}")
    # A device plugin or an operator advertises new VFs seconds after they appear.
    time.sleep(args.settle)
    for kind in KINDS:
        runtime.remove(pair(runtime, plugin, kind, f"{name[0]}{n}", series, stats, args.bound))
    vfs.disable(pf)


def figures(values: list[float]) -> str:
    return f"median {statistics.median(values):5.2f} s  max {max(values):5.2f} s  (n={len(values)})"


def report(results: dict[tuple[str, str], Series], rounds: int) -> None:
    print(f"\nseconds from the pair's first start to a ping both ways ({rounds} rounds, pairs of pods)")
    for (runtime, plugin), series in results.items():
        for kind in KINDS:
            print(
                f"{runtime:>6} {plugin:>11} {kind:>6}: ready {figures(series.ready[kind])};"
                f"  runtime call {figures(series.call[kind])}"
            )
    print("\nsriov in the daemon, per pod start: its ADD, and the other calls the runtime made of it")
    for (runtime, plugin), series in results.items():
        for kind in KINDS if plugin == "sriov" else ():
            print(f"{runtime:>6} {kind:>6}: ADD {figures(series.add[kind])};  others {figures(series.others[kind])}")
    print("\nsriov / host-device (medians)")
    for runtime in dict.fromkeys(r for r, _ in results):
        ours, peer = results[runtime, "sriov"], results[runtime, "host-device"]
        for kind in KINDS:
            ready = statistics.median(ours.ready[kind]) / statistics.median(peer.ready[kind])
            call = statistics.median(ours.call[kind]) / statistics.median(peer.call[kind])
            print(f"{runtime:>6} {kind:>6}: ready {ready:.2f}x  runtime call {call:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pf", help="SR-IOV PF (default: the first igb PF)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runtime", action="append", choices=RUNTIMES, help="only this runtime (repeat it)")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds from creating the VFs to the first start")
    parser.add_argument("--bound", type=float, default=90.0, help="seconds to wait for traffic before giving up")
    args = parser.parse_args()
    pf = args.pf or next((p.name for p in sorted(SYS_NET.iterdir()) if is_sriov_igb(p)), None)
    if pf is None:
        sys.exit("bench_runtime_ready: no igb PF (run it in the rig's guest, or give --pf)")
    names = args.runtime or list(RUNTIMES)
    base = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    with ExitStack() as stack:
        storage = stack.enter_context(runtime_storage())
        for path in (CNI_BIN, CNI_CONF):
            # 0755 as on a node (a tmpfs is 1777 by default).
            stack.enter_context(mounted("tmpfs", path, "-o", "mode=0755"))
        # The static shim, as on a node; the chain's and the peer's Go plugins beside it.
        run(sys.executable, str(ROOT / "bin" / "sriov-cni"), "install-cni", "--dest", str(CNI_BIN))
        cni_bin_dir(CNI_BIN)
        for name in ("host-device", "static"):
            (CNI_BIN / name).symlink_to(GO_PLUGINS / name)
        print("bench_runtime_ready: starting the daemon and the runtimes", flush=True)
        # Each of its children writes what its call cost there, after answering.
        stats = base / "stats"
        stats.mkdir()
        stack.enter_context(Daemon(Path(DEFAULT_SOCKET).parent, env={measure.STATS_ENV: str(stats)}))
        runtimes: dict[str, Runtime] = {}
        if "podman" in names:
            runtimes["podman"] = PodmanRuntime(base, storage, pf)
        if "cri" in names:
            (storage / "logs").mkdir()
            containerd = stack.enter_context(containerd_cri(storage))
            runtimes["cri"] = CriRuntime(containerd, storage / "logs", pf, base / "cri-data")
        results = {(name, plugin): Series() for name in runtimes for plugin in PLUGINS}
        for n in range(args.rounds):
            for name, runtime in runtimes.items():
                # Each plugin first every other round: neither always follows the other's DELs.
                for plugin in PLUGINS[:: 1 if n % 2 == 0 else -1]:
                    round_(runtime, name, plugin, pf, n, results[name, plugin], stats, args)
            print(f"round {n + 1}/{args.rounds} done", flush=True)
    report(results, args.rounds)


if __name__ == "__main__":
    main()
