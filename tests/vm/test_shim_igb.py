"""The static shim and the daemon on the real igb/igbvf driver (runs in the rig's QEMU guest).

The runtime's side is a chroot that holds nothing but what install-cni
wrote (the shim as ``sriov`` and ``sriov-ipam``) and bind mounts of the
daemon's socket directory, /proc and the netns directory: no Python, no
libc, so every call that works went through the socket. The daemon is
``sriov-cni daemon`` outside the chroot, as the DaemonSet's pod is.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.daemon import install
from tests.support.daemonlib import Daemon
from tests.vm.plugincalls import host_link, ns_path, records, restored, vfinfo, view
from tests.vm.vmlib import Sriov, ip_json, pf_pci_dir, vf_pci_dirs, wait_until

pytestmark = pytest.mark.sriov_vm

REPO = Path(__file__).resolve().parents[2]
INSIDE = ("run/sriov-cni", "proc", "var/run/netns")
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


@pytest.fixture(autouse=True)
def shim_built() -> None:
    if not Path(install.SHIM).exists():
        pytest.fail("the shim is not built: make -C shim (tests/setup-host.sh does it)", pytrace=False)


class Node:
    """A daemon on ``work/sock/plugin.sock`` and the runtime's chroot ``work/root``."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.root = work / "root"
        self.sock = work / "sock" / "plugin.sock"
        self.mounts: list[Path] = []
        self.daemon: Daemon | None = None
        self.calls = 0

    def start_daemon(self) -> None:
        self.daemon = Daemon(self.sock.parent)

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.daemon = None

    def daemon_children(self) -> list[int]:
        """The daemon's children running a call (spares not)."""
        assert self.daemon is not None
        return self.daemon.children()

    def build_chroot(self) -> None:
        """After the pods exist: the netns directory is bound as it is then."""
        self.sock.parent.mkdir()
        bindir = self.root / "opt" / "cni" / "bin"
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from sriov_cni.cli import main; main()",
                "install-cni",
                "--dest",
                str(bindir),
                "--create-dest",
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        files = sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())
        assert files == ["opt/cni/bin/sriov", "opt/cni/bin/sriov-ipam"]
        for exe in bindir.iterdir():
            assert exe.read_bytes() == Path(install.SHIM).read_bytes()
            ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
            assert "not a dynamic executable" in ldd.stdout + ldd.stderr
        for inside, outside in zip(INSIDE, (self.sock.parent, Path("/proc"), Path("/var/run/netns")), strict=True):
            target = self.root / inside
            target.mkdir(parents=True)
            subprocess.run(["mount", "--rbind", str(outside), str(target)], check=True)
            self.mounts.append(target)

    def teardown(self) -> None:
        self.stop_daemon()
        for target in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(target)], check=True)

    def shim(
        self, command: str, conf: dict[str, Any], container: str, netns: str, ifname: str = "net1", args: str = ""
    ) -> subprocess.Popen[bytes]:
        """The runtime's call: the shim, run inside the chroot, on its way."""
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(self.work / "ipam-bin"),
        }
        if args:
            env["CNI_ARGS"] = args
        # From a file, so that callers can start many calls before waiting.
        self.calls += 1
        config = self.work / f"call-{self.calls}.json"
        config.write_text(json.dumps(conf))
        with config.open("rb") as stdin:
            # The runtime's environment has no PATH to find chroot with.
            proc = subprocess.Popen(
                [CHROOT, str(self.root), "/opt/cni/bin/sriov"], env=env, stdin=stdin, stdout=subprocess.PIPE
            )
        return proc


def answer(proc: subprocess.Popen[bytes], timeout: float = 600) -> tuple[int, Any]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, (json.loads(out) if out.strip() else None)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.teardown()


def conf_for(node: Node, pfs: list[str], **keys: Any) -> dict[str, Any]:
    return {
        "cniVersion": "1.1.0",
        "name": f"shimnet-{os.getpid()}",
        "type": "sriov",
        "pfNames": pfs,
        "dataDir": str(node.work / "state"),
        **keys,
    }


def vf_state(pf: str, vfs: list[str]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """What DEL must give back, per VF netdev: the PF's view and the netdev's."""
    state = {}
    for i, name in enumerate(vfs):
        netdev = view(host_link(name))
        assert netdev is not None
        state[name] = (vfinfo(pf, i), netdev)
    return state


def assert_restored(pf: str, vfs: list[str], before: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> None:
    for i, name in enumerate(vfs):
        info, netdev = before[name]
        restored(vfinfo(pf, i), info)
        assert view(host_link(name)) == netdev


def pod_view(pod: str) -> list[str]:
    return sorted(str(x["ifname"]) for x in ip_json("link", "show", netns=pod))


def test_add_check_gc_del_from_a_chroot_without_python(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node
) -> None:
    pf = igb_pfs[0]
    vfs = sriov.enable(pf, 1)
    before = vf_state(pf, vfs)
    pod = netns()
    node.build_chroot()
    node.start_daemon()
    conf = conf_for(
        node, [pf], vlan=42, ipam={"type": "sriov-ipam", "subnet": "10.88.0.0/24", "dataDir": str(node.work / "ipam")}
    )

    rc, res = answer(node.shim("ADD", conf, "c1", ns_path(pod)))
    assert rc == 0, res
    assert res["interfaces"][0]["pciID"] == vf_pci_dirs(pf)[0].name
    assert res["ips"][0]["address"].startswith("10.88.0.")
    assert pod_view(pod) == ["lo", "net1"] and host_link(vfs[0]) is None
    assert vfinfo(pf, 0)["vlan_list"] == [{"vlan": 42}]
    [addr] = [a for a in ip_json("addr", "show", "dev", "net1", netns=pod)[0]["addr_info"] if a["family"] == "inet"]
    assert f"{addr['local']}/{addr['prefixlen']}" == res["ips"][0]["address"]

    rc, out = answer(node.shim("CHECK", dict(conf, prevResult=res), "c1", ns_path(pod)))
    assert (rc, out) == (0, None)
    attachment = {"containerID": "c1", "ifname": "net1"}
    rc, out = answer(node.shim("GC", dict(conf, **{"cni.dev/valid-attachments": [attachment]}), "", ""))
    assert (rc, out) == (0, None)
    assert pod_view(pod) == ["lo", "net1"], "GC keeps a valid attachment"

    rc, out = answer(node.shim("DEL", conf, "c1", ns_path(pod)))
    assert (rc, out) == (0, None)
    assert_restored(pf, vfs, before)
    assert pod_view(pod) == ["lo"] and records(node.work / "state") == []
    rc, out = answer(node.shim("GC", dict(conf, **{"cni.dev/valid-attachments": []}), "", ""))
    assert (rc, out) == (0, None)


def test_daemon_stopped_is_try_again(igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node) -> None:
    pf = igb_pfs[0]
    sriov.enable(pf, 1)
    pod = netns()
    node.build_chroot()
    node.start_daemon()
    node.stop_daemon()
    # The bound: a runtime must learn within 5 s that nobody serves the call.
    rc, res = answer(node.shim("ADD", conf_for(node, [pf]), "c1", ns_path(pod)), timeout=5)
    assert rc == 1 and res["code"] == 11, res
    assert "/run/sriov-cni/plugin.sock" in res["msg"] and "sriov-cni daemon" in res["msg"]
    assert pod_view(pod) == ["lo"] and records(node.work / "state") == []


def test_daemon_child_killed_during_add_then_del_cleans_up(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node
) -> None:
    pf = igb_pfs[0]
    vfs = sriov.enable(pf, 1)
    before = vf_state(pf, vfs)
    pod = netns()
    # An IPAM plugin that stops the ADD after the VF moved into the pod,
    # until the test has killed the daemon's child there.
    mark = node.work / "ipam-pid"
    (node.work / "ipam-bin").mkdir()
    blocker = node.work / "ipam-bin" / "stall"
    blocker.write_text(
        f'#!/bin/sh\nif [ "$CNI_COMMAND" = ADD ]; then echo $$ > {mark}.tmp; mv {mark}.tmp {mark}; exec sleep 600; fi\n'
    )
    blocker.chmod(0o755)
    node.build_chroot()
    node.start_daemon()
    conf = conf_for(node, [pf], ipam={"type": "stall"})

    proc = node.shim("ADD", conf, "c1", ns_path(pod))
    # IPAM starts beside the VF's set-up, and ADD waits for its answer only
    # once the VF is in the pod: both are waited for, in either order.
    wait_until(lambda: mark.exists() and pod_view(pod) == ["lo", "net1"], 600, "the ADD in IPAM with the VF moved")
    [child] = node.daemon_children()
    os.kill(child, signal.SIGKILL)
    os.kill(int(mark.read_text()), signal.SIGKILL)
    rc, res = answer(proc)
    assert rc == 1 and res["code"] == 11, res
    assert "ended without an answer" in res["msg"] and "not retried" in res["msg"]
    assert pod_view(pod) == ["lo", "net1"], "nothing retried or undone behind the runtime's back"

    rc, out = answer(node.shim("DEL", conf, "c1", ns_path(pod)))
    assert (rc, out) == (0, None)
    assert_restored(pf, vfs, before)
    assert pod_view(pod) == ["lo"] and records(node.work / "state") == []


def test_fourteen_concurrent_adds_through_the_shim(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node
) -> None:
    pfs = igb_pfs[:2]
    vfs = {pf: sriov.enable(pf, 7) for pf in pfs}
    before = {pf: vf_state(pf, vfs[pf]) for pf in pfs}
    pods = [netns() for _ in range(14)]
    node.build_chroot()
    node.start_daemon()
    conf = conf_for(node, pfs, vlan=14)

    adds = [node.shim("ADD", conf, f"par{i}", ns_path(pod)) for i, pod in enumerate(pods)]
    results = [answer(p) for p in adds]

    assert [rc for rc, _ in results] == [0] * 14, results
    taken = [res["interfaces"][0]["pciID"] for _, res in results]
    assert sorted(taken) == sorted(d.name for pf in pfs for d in vf_pci_dirs(pf))
    assert all(pod_view(pod) == ["lo", "net1"] for pod in pods)
    assert len(records(node.work / "state")) == 14

    dels = [node.shim("DEL", conf, f"par{i}", ns_path(pod)) for i, pod in enumerate(pods)]
    assert [answer(p) for p in dels] == [(0, None)] * 14
    assert records(node.work / "state") == []
    assert all(pod_view(pod) == ["lo"] for pod in pods)
    for pf in pfs:
        assert_restored(pf, vfs[pf], before[pf])


def test_dra_standalone_and_multus_calls_give_two_pods_that_ping(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node
) -> None:
    """dra-driver-sriov's two modes, as it and Multus call the plugin, on two VFs of one PF.

    Pod A as the driver calls in STANDALONE mode (libcni from containerd's
    NRI hook): the NAD's config with a top-level deviceID, kubelet's
    CNI_ARGS, no runtimeConfig, ifname vfnet0, DEL repeated.  Pod B as
    Multus calls in MULTUS mode: runtimeConfig.deviceID and the device-info
    file Multus copied from the driver's.  The two pods ping each other
    through the NIC.  Real: igb/igbvf, the shim in a chroot, the daemon;
    the driver's device-info file is written by the test.  Costs two VFs,
    two ADDs, a carrier wait, three refused ADDs and three DELs (about 40 s
    under TCG).
    """
    pf = igb_pfs[0]
    vfs = sriov.enable(pf, 2)
    before = vf_state(pf, vfs)
    pf_pci = pf_pci_dir(pf).name
    vf_a, vf_b = (d.name for d in vf_pci_dirs(pf))
    pods = [netns(), netns()]
    node.build_chroot()
    node.start_daemon()
    ipam = {"type": "sriov-ipam", "subnet": "10.87.0.0/24", "dataDir": str(node.work / "ipam")}
    nad = {"cniVersion": "1.0.0", "name": f"dranet-{os.getpid()}", "type": "sriov", "ipam": ipam}
    nad["dataDir"] = str(node.work / "state")
    args = (
        "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-a;"
        "K8S_POD_INFRA_CONTAINER_ID=dra-a;K8S_POD_UID=7d9e0c1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
    )
    standalone = dict(nad, deviceID=vf_a)
    devinfo = node.work / "devinfo" / "cni" / f"{nad['name']}-dra-b_net1"
    devinfo.parent.mkdir(parents=True)
    devinfo.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": vf_b}}))
    multus = dict(nad, runtimeConfig={"deviceID": vf_b, "CNIDeviceInfoFile": str(devinfo)})

    rc, res_a = answer(node.shim("ADD", standalone, "dra-a", ns_path(pods[0]), "vfnet0", args))
    assert rc == 0, res_a
    rc, res_b = answer(node.shim("ADD", multus, "dra-b", ns_path(pods[1])))
    assert rc == 0, res_b
    # What the driver copies into the ResourceClaim's status: the interface in the sandbox, its MAC, every IP.
    [iface_a] = [i for i in res_a["interfaces"] if i.get("sandbox")]
    [link_a] = ip_json("link", "show", "dev", "vfnet0", netns=pods[0])
    assert (iface_a["name"], iface_a["mac"]) == ("vfnet0", link_a["address"])
    assert [ip["address"] for ip in res_a["ips"]] == ["10.87.0.2/24"]
    assert json.loads(devinfo.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": vf_b, "pf-pci-address": pf_pci},
    }

    # Both VFs are held: a pool of this PF has none, and a deviceID held is refused naming its holder.
    rc, res = answer(node.shim("ADD", dict(nad, pfNames=[pf]), "pool", ns_path(pods[1]), "net2"))
    assert rc == 1 and res["code"] == 101 and res["msg"] == "no free VF in the pool (2 VFs, all taken)", res
    rc, res = answer(node.shim("ADD", standalone, "dra-c", ns_path(pods[1]), "vfnet1", args))
    assert rc == 1 and res["code"] == 101, res
    assert res["msg"] == f"VF {vf_a} (container dra-a, netns {ns_path(pods[0])}) is not free"

    for pod, ifname in zip(pods, ("vfnet0", "net1"), strict=True):
        sriov.wait_carrier(ifname, pod)
    ping = subprocess.run(
        ["ip", "netns", "exec", pods[0], "ping", "-c", "3", "-i", "0.2", "-W", "5", "10.87.0.3"],
        capture_output=True,
        text=True,
    )
    assert ping.returncode == 0 and " 0% packet loss" in ping.stdout, ping.stdout + ping.stderr

    # StopPodSandbox runs DEL, and may run it again.
    for _ in range(2):
        assert answer(node.shim("DEL", standalone, "dra-a", ns_path(pods[0]), "vfnet0", args)) == (0, None)
    assert answer(node.shim("DEL", multus, "dra-b", ns_path(pods[1]))) == (0, None)
    assert_restored(pf, vfs, before)
    assert [pod_view(pod) for pod in pods] == [["lo"], ["lo"]] and records(node.work / "state") == []
    # Multus' copy: Multus removes it after DEL, not the plugin.
    assert devinfo.exists()
