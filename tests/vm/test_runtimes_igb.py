"""Real runtimes drive the sriov plugin on igb: podman (CNI backend) and containerd (``ctr run --cni``).

Runtimes differ from our own harnesses: libcni chains plugins and caches
results, passes capabilities as runtimeConfig (podman's ``--mac-address``
and ``--ip``), names the interface eth0, and calls DEL on every teardown
path.  Both runtimes use deploy/podman/10-sriov.conflist (sriov, then tuning) and
podman deploy/podman/containers.conf, rendered only with this guest's PF and
private directories.  Effects are read with ``ip -j`` on the PF and through
``nsenter`` in the containers' network namespaces, not through the runtime.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import pytest

from sriov_cni.daemon.client import DEFAULT_SOCKET
from tests.support.daemonlib import Daemon
from tests.vm.runtimelib import (
    IMAGE,
    RUNTIME_TIMEOUT,
    Podman,
    PodmanHost,
    assert_as_found,
    assert_pings,
    assert_pod_carrier,
    busybox_rootfs,
    cni_bin_dir,
    in_netns,
    ipv4,
    leases,
    mounted,
    pod_eth0,
    records,
    render_conflist,
    run,
    runtime_storage,
    vf_picture,
)
from tests.vm.vmlib import Sriov, vf_pci_dirs, wait_until

pytestmark = pytest.mark.sriov_vm

SUBNET_PREFIX = "10.66.0."  # deploy/podman/10-sriov.conflist's range
ARP_NOTIFY = "/proc/sys/net/ipv4/conf/eth0/arp_notify"  # the conflist's tuning sysctl


# --- where the sriov CNI executables come from ------------------------------------
# Each provider fills a CNI bin dir and keeps what it needs running until the
# module's tests are done.


def install_cni(dest: Path, *args: str) -> None:
    exe = shutil.which("sriov-cni")
    if exe is None:
        pytest.fail("sriov-cni is not on PATH: run tests/setup-host.sh")
    run(exe, "install-cni", "--dest", str(dest), *args)


@contextmanager
def shim_and_daemon(dest: Path) -> Iterator[None]:
    """The static shim ``install-cni`` writes, served by ``sriov-cni daemon`` on the default socket."""
    install_cni(dest)
    with Daemon(Path(DEFAULT_SOCKET).parent):
        yield


@contextmanager
def package_executables(dest: Path) -> Iterator[None]:
    """The installed package's own Python executables, which run each call in process."""
    install_cni(dest, "--python", sys.executable)
    yield


PROVIDERS: dict[str, Callable[[Path], AbstractContextManager[None]]] = {
    "package": package_executables,
    "shim": shim_and_daemon,
}
# The two long scenarios run once each, with a provider each, so that every
# runtime and every provider carries traffic once: podman through the shim
# (what install-cni writes on a node with the daemon), containerd through
# the Python executables.  A provider changes how a call reaches the plugin,
# which the short failing-chain test and the shim's own tests cover for both.
only_shim = pytest.mark.parametrize("cni_bin", ["shim"], indirect=True)
only_package = pytest.mark.parametrize("cni_bin", ["package"], indirect=True)


@pytest.fixture(scope="module", params=sorted(PROVIDERS))
def cni_bin(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    dest = tmp_path_factory.mktemp("cni-bin")
    with PROVIDERS[request.param](dest):
        cni_bin_dir(dest)
        yield dest


@pytest.fixture(scope="module")
def storage() -> Iterator[Path]:
    with runtime_storage() as path:
        yield path


# --- podman ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman_host(
    storage: Path, cni_bin: Path, igb_pfs: list[str], tmp_path_factory: pytest.TempPathFactory
) -> PodmanHost:
    base = tmp_path_factory.mktemp("podman")
    host = PodmanHost(base, storage, cni_bin, igb_pfs[0])
    host.network(host.conf)("import", "--change", 'CMD ["/bin/sh"]', str(busybox_rootfs(base)), IMAGE)
    return host


def removing_all(pm: Podman) -> Iterator[Podman]:
    """Yield ``pm``; then remove every container (before ``sriov`` takes the VFs away)."""
    yield pm
    pm("rm", "--force", "--time", "0", "--all", check=False)


@pytest.fixture
def podman(podman_host: PodmanHost, sriov: Sriov) -> Iterator[Podman]:
    """podman on deploy/podman/10-sriov.conflist's network."""
    yield from removing_all(podman_host.network(podman_host.conf))


@pytest.fixture
def broken_podman(podman_host: PodmanHost, sriov: Sriov) -> Iterator[Podman]:
    """The same chain, but its second plugin fails: tuning refuses a sysctl
    the kernel does not have, after sriov has already given the VF."""
    conf = copy.deepcopy(podman_host.conf)
    conf["name"] += "-badsysctl"
    conf["plugins"][1]["sysctl"] = {"net.ipv4.conf.eth0.no_such_sysctl": "1"}
    yield from removing_all(podman_host.network(conf))


@only_shim
def test_podman_two_containers_mac_ip_ping_restart_rm(podman: Podman, sriov: Sriov, igb_pfs: list[str]) -> None:
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    before = vf_picture(pf)
    vf_pcis = [d.name for d in vf_pci_dirs(pf)]
    assert records(podman.data) == [] and leases(podman.data) == []
    mac, ip_b = "02:00:00:5a:10:01", f"{SUBNET_PREFIX}50"
    common = ["run", "--detach", "--network", podman.network, "--cap-add", "NET_RAW"]
    starts = [
        podman.start(*common, "--name", "a", "--mac-address", mac, IMAGE, "sleep", "3600"),
        podman.start(*common, "--name", "b", "--ip", ip_b, IMAGE, "sleep", "3600"),
    ]
    for proc in starts:
        out, err = proc.communicate(timeout=RUNTIME_TIMEOUT)
        assert proc.returncode == 0, out + err

    by_mac = {pod_eth0(ns)["address"]: ns for ns in podman.namespaces()}
    assert len(by_mac) == 2 and mac in by_mac, by_mac
    netns = {"a": by_mac.pop(mac), "b": by_mac.popitem()[1]}
    a, b = pod_eth0(netns["a"]), pod_eth0(netns["b"])
    # Each container has its own VF as eth0.
    assert sorted([a["parentdev"], b["parentdev"]]) == sorted(vf_pcis)
    inside = vf_picture(pf)
    assert all(v["netdev"] is None for v in inside.values()), inside
    # --mac-address reached the VF through the mac capability: the PF holds
    # it as the VF's admin MAC, and the netdev in the container carries it.
    assert a["address"] == mac
    assert inside[vf_pcis.index(a["parentdev"])]["vfinfo"]["address"] == mac
    # --ip reached sriov-ipam through the ips capability.
    assert ipv4(b) == f"{ip_b}/24"
    assert ipv4(a).startswith(SUBNET_PREFIX) and ipv4(a) != ipv4(b)
    for ns in netns.values():
        assert in_netns(ns, "cat", ARP_NOTIFY).strip() == "1"  # tuning ran after sriov
    assert records(podman.data) == sorted(vf_pcis)
    assert len(leases(podman.data)) == 2

    # Fresh VFs, as the node's first pods get them: traffic both ways as
    # soon as podman run returns.
    for ns in netns.values():
        assert_pod_carrier(ns)
    assert_pings(netns["a"], ip_b)
    assert_pings(netns["b"], ipv4(a))

    # restart is DEL then ADD: b gets a VF and its --ip again.
    podman("restart", "--time", "0", "b")
    [b_netns] = podman.namespaces() - {netns["a"]}
    b = pod_eth0(b_netns)
    assert b["parentdev"] in vf_pcis and b["parentdev"] != a["parentdev"]
    assert ipv4(b) == f"{ip_b}/24"
    assert in_netns(b_netns, "cat", ARP_NOTIFY).strip() == "1"
    assert records(podman.data) == sorted(vf_pcis)
    assert len(leases(podman.data)) == 2
    # The VF b had before, with no MAC configured: traffic both ways again.
    assert_pod_carrier(b_netns)
    assert_pings(netns["a"], ip_b)
    assert_pings(b_netns, ipv4(a))

    podman("rm", "--force", "--time", "0", "a", "b")

    assert_as_found(vf_picture(pf), before)
    assert records(podman.data) == [] and leases(podman.data) == []
    assert podman.namespaces() == set()

    # Two new containers on the same two VFs, neither with a MAC, one on the
    # VF a's --mac-address was set on: the VFs were given back without it
    # and each pod runs on the MAC its VF has.
    starts = [podman.start(*common, "--name", name, IMAGE, "sleep", "3600") for name in ("c", "d")]
    for proc in starts:
        out, err = proc.communicate(timeout=RUNTIME_TIMEOUT)
        assert proc.returncode == 0, out + err
    c_netns, d_netns = sorted(podman.namespaces())
    c, d = pod_eth0(c_netns), pod_eth0(d_netns)
    assert sorted([c["parentdev"], d["parentdev"]]) == sorted(vf_pcis)
    assert mac not in (c["address"], d["address"])
    for ns in (c_netns, d_netns):
        assert_pod_carrier(ns)
    assert_pings(c_netns, ipv4(d))
    assert_pings(d_netns, ipv4(c))
    podman("rm", "--force", "--time", "0", "c", "d")
    assert_as_found(vf_picture(pf), before)
    assert records(podman.data) == [] and leases(podman.data) == []


def test_podman_start_failing_later_in_chain_leaves_nothing(
    broken_podman: Podman, sriov: Sriov, igb_pfs: list[str]
) -> None:
    podman = broken_podman
    pf = igb_pfs[0]
    sriov.enable(pf, 1)
    before = vf_picture(pf)

    proc = podman(
        "run", "--detach", "--name", "broken", "--network", podman.network, IMAGE, "sleep", "3600", check=False
    )

    assert proc.returncode != 0 and "no_such_sysctl" in proc.stderr, proc.stdout + proc.stderr
    assert_as_found(vf_picture(pf), before)
    assert records(podman.data) == [] and leases(podman.data) == []
    podman("rm", "--force", "--time", "0", "broken")
    assert_as_found(vf_picture(pf), before)
    assert records(podman.data) == [] and leases(podman.data) == []


# --- containerd --------------------------------------------------------------------


class Ctr:
    """``ctr`` against a containerd of the test's own (socket, root and state)."""

    def __init__(self, socket: Path, data: Path) -> None:
        self.socket = socket
        self.data = data
        self.runs: dict[str, subprocess.Popen[str]] = {}

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run("ctr", "--address", str(self.socket), *args, check=check)

    def run_task(self, name: str) -> None:
        """``ctr run --cni --rm`` in the background: it runs DEL and deletes the task once it exits."""
        self.runs[name] = subprocess.Popen(
            [
                "ctr",
                "--address",
                str(self.socket),
                "run",
                "--cni",
                "--rm",
                "--snapshotter",
                "native",
                "--cap-add",
                "CAP_NET_RAW",
                IMAGE,
                name,
                "sleep",
                "3600",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def tasks(self) -> dict[str, tuple[int, str]]:
        """``ctr task ls``: name -> (pid, status)."""
        rows = [line.split() for line in self("task", "ls").stdout.splitlines()[1:]]
        return {r[0]: (int(r[1]), r[2]) for r in rows if len(r) == 3}

    def wait_running(self, *names: str) -> dict[str, int]:
        """Wait until ctr run set up the network and started each task; their pids."""

        def running() -> bool:
            for name in names:
                if self.runs[name].poll() is not None:
                    pytest.fail(
                        f"ctr run {name} exited {self.runs[name].returncode}: {self.runs[name].communicate()[0]}"
                    )
            tasks = self.tasks()
            return all(tasks.get(n, (0, ""))[1] == "RUNNING" for n in names)

        wait_until(running, RUNTIME_TIMEOUT, f"tasks {', '.join(names)} running")
        return {n: self.tasks()[n][0] for n in names}

    def kill(self, name: str, check: bool = True) -> str:
        """SIGKILL the task (sleep as PID 1 ignores SIGTERM); wait for ctr run to clean up; its output."""
        self("task", "kill", "--signal", "SIGKILL", name, check=check)
        out, _ = self.runs.pop(name).communicate(timeout=RUNTIME_TIMEOUT)
        return out


@pytest.fixture(scope="module")
def containerd_daemon(
    storage: Path, cni_bin: Path, igb_pfs: list[str], podman_host: PodmanHost, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ctr]:
    base = tmp_path_factory.mktemp("containerd")
    conf_dir = base / "net.d"
    conf_dir.mkdir()
    data = base / "data"
    (conf_dir / "10-sriov.conflist").write_text(json.dumps(render_conflist(igb_pfs[0], data)))
    socket = base / "containerd.sock"
    config = base / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{storage / "containerd"}"\n'
        f'state = "{storage / "containerd-state"}"\n'
        # Kubernetes' CRI is not what this drives, and needs its own setup.
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\naddress = "{socket}"\n'
    )
    archive = base / "image.tar"
    # The image podman imported, in the one format both runtimes read.
    podman_host.network(podman_host.conf)("save", "--format", "oci-archive", "--output", str(archive), IMAGE)
    with ExitStack() as stack:
        # ctr run --cni has no flags for these: it reads the first conflist in
        # /etc/cni/net.d and runs plugins from /opt/cni/bin.
        stack.enter_context(mounted(str(conf_dir), Path("/etc/cni/net.d")))
        stack.enter_context(mounted(str(cni_bin), Path("/opt/cni/bin")))
        log = stack.enter_context(open(base / "containerd.log", "w"))
        daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
        ctr = Ctr(socket, data)
        try:
            wait_until(lambda: ctr("version", check=False).returncode == 0, RUNTIME_TIMEOUT, "containerd to serve")
            ctr("images", "import", "--snapshotter", "native", "--base-name", IMAGE.rsplit(":", 1)[0], str(archive))
            yield ctr
        finally:
            daemon.terminate()
            daemon.wait(timeout=RUNTIME_TIMEOUT)


@pytest.fixture
def containerd(containerd_daemon: Ctr, sriov: Sriov) -> Iterator[Ctr]:
    """The test's tasks are killed (and so deleted) before ``sriov`` takes the VFs away."""
    yield containerd_daemon
    for name in list(containerd_daemon.runs):
        containerd_daemon.kill(name, check=False)


@only_package
def test_containerd_two_tasks_ping_then_kill_delete_gives_vfs_back(
    containerd: Ctr, sriov: Sriov, igb_pfs: list[str]
) -> None:
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    before = vf_picture(pf)
    vf_pcis = [d.name for d in vf_pci_dirs(pf)]
    assert records(containerd.data) == [] and leases(containerd.data) == []

    for name in ("t1", "t2"):
        containerd.run_task(name)
    pids = containerd.wait_running("t1", "t2")

    netns = {name: f"/proc/{pid}/ns/net" for name, pid in pids.items()}
    eth0 = {name: pod_eth0(ns) for name, ns in netns.items()}
    assert sorted(e["parentdev"] for e in eth0.values()) == sorted(vf_pcis)
    assert all(ipv4(e).startswith(SUBNET_PREFIX) for e in eth0.values()), eth0
    # Fresh VFs and no MAC configured (ctr has no flag for one): traffic
    # both ways as soon as the tasks run.
    for ns in netns.values():
        assert in_netns(ns, "cat", ARP_NOTIFY).strip() == "1"
        assert_pod_carrier(ns)
    assert_pings(netns["t1"], ipv4(eth0["t2"]))
    assert_pings(netns["t2"], ipv4(eth0["t1"]))

    out = containerd.kill("t1")

    # ctr run ran DEL (with no netns: the task's died with it) and, for
    # --rm, deleted the task and the container.
    t1_vf = vf_pcis.index(eth0["t1"]["parentdev"])
    assert "t1" not in containerd.tasks(), out
    assert "t1" not in containerd("containers", "ls", "--quiet").stdout.split()
    now = vf_picture(pf)
    assert_as_found({t1_vf: now[t1_vf]}, {t1_vf: before[t1_vf]})
    assert records(containerd.data) == [eth0["t2"]["parentdev"]], out
    assert len(leases(containerd.data)) == 1

    # A new task on the VF t1 had: it and t2 reach each other both ways.
    containerd.run_task("t3")
    t3_netns = f"/proc/{containerd.wait_running('t3')['t3']}/ns/net"
    t3 = pod_eth0(t3_netns)
    assert t3["parentdev"] == eth0["t1"]["parentdev"]
    assert_pod_carrier(t3_netns)
    assert_pings(t3_netns, ipv4(eth0["t2"]))
    assert_pings(netns["t2"], ipv4(t3))
    containerd.kill("t3")

    out = containerd.kill("t2")

    assert_as_found(vf_picture(pf), before)
    assert records(containerd.data) == [] and leases(containerd.data) == [], out
