"""Real container runtimes in the igb guest: podman (CNI backend) and containerd.

Everything here changes only the guest: its root is a throw-away overlay of
this machine's, so the runtimes installed by tests/setup-host.sh run there
without being configured on the machine itself.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFLIST = REPO / "deploy" / "podman" / "10-sriov.conflist"
CONTAINERS_CONF = REPO / "deploy" / "podman" / "containers.conf"
DISTRO_CNI_DIR = Path("/usr/lib/cni")
# The chain's other plugins and the loopback plugin containerd adds to it.
DISTRO_PLUGINS = ("tuning", "host-local", "loopback")
IMAGE = "localhost/sriov-busybox:latest"
BUSYBOX_APPLETS = ("sh", "sleep", "ping", "ip", "cat")
# Generous for TCG on a shared machine: one podman command costs 10-40 s there.
RUNTIME_TIMEOUT = 300.0


def run(*cmd: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, env=env, timeout=RUNTIME_TIMEOUT)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc


# --- the guest's host side -----------------------------------------------------


@contextmanager
def mounted(fstype: str, target: Path, *options: str) -> Iterator[None]:
    """Mount ``fstype`` on ``target`` (bind mounts: ``fstype`` is the source)."""
    target.mkdir(parents=True, exist_ok=True)
    if fstype.startswith("/"):
        run("mount", "--bind", fstype, str(target))
    else:
        run("mount", "-t", fstype, *options, fstype, str(target))
    try:
        yield
    finally:
        run("umount", "-l", str(target))


@contextmanager
def cgroup2() -> Iterator[None]:
    """The unified cgroup hierarchy both runtimes put containers in (the rig's init mounts none)."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        yield
        return
    with mounted("cgroup2", root):
        yield


def busybox_rootfs(dest: Path) -> Path:
    """A tarball of a root filesystem holding only busybox-static, as the rig downloaded it."""
    from tests.vm.rig import cache_dir  # the guest sees the rig's cache through the host root

    found = sorted(cache_dir().glob("busybox-static_*/bin/busybox"))
    if not found:
        pytest.fail(f"no busybox-static unpacked under {cache_dir()}: boot the guest with tests/vm/rig.py")
    tree = dest / "rootfs"
    (tree / "bin").mkdir(parents=True)
    shutil.copy2(found[-1], tree / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (tree / "bin" / applet).symlink_to("busybox")
    tarball = dest / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(tree, arcname=".")
    return tarball


def cni_bin_dir(dest: Path) -> None:
    """Add the distribution's plugins the chain uses to a bin dir holding sriov's."""
    for name in DISTRO_PLUGINS:
        (dest / name).symlink_to(DISTRO_CNI_DIR / name)


def render_conflist(pf: str, data_dir: Path, **overrides: Any) -> dict[str, Any]:
    """deploy/podman/10-sriov.conflist for this guest: its PF and a private store and IPAM directory."""
    conf: dict[str, Any] = json.loads(CONFLIST.read_text())
    sriov, tuning = conf["plugins"]
    assert sriov["type"] == "sriov" and tuning["type"] == "tuning", conf
    sriov["pfNames"] = [pf]
    sriov["dataDir"] = str(data_dir / "sriov")
    sriov["ipam"]["dataDir"] = str(data_dir / "ipam")
    conf.update(overrides)
    return conf


def render_containers_conf(bin_dir: Path, conf_dir: Path) -> str:
    """deploy/podman/containers.conf with the test's plugin and network directories."""
    text = CONTAINERS_CONF.read_text()
    for key, value in (("cni_plugin_dirs", f'["{bin_dir}"]'), ("network_config_dir", f'"{conf_dir}"')):
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, f"deploy/podman/containers.conf has no single {key} line"
    return text


@contextmanager
def runtime_storage() -> Iterator[Path]:
    """cgroup2 for the containers, and a tmpfs for the runtimes' images and containers.

    The guest's root is an overlay, on which neither runtime can stack its
    own overlay: podman uses vfs there and containerd the native snapshotter.
    The path is kept short: podman refuses a runroot longer than 50
    characters, which pytest's numbered temporary directories outgrow.
    """
    path = Path(tempfile.mkdtemp(prefix="sriov-rt-"))
    try:
        with cgroup2(), mounted("tmpfs", path):
            yield path
    finally:
        path.rmdir()


# --- podman --------------------------------------------------------------------


class Podman:
    """podman as root on a host without systemd, configured by containers.conf, for one network."""

    def __init__(self, storage: Path, containers_conf: Path, data: Path, network: str) -> None:
        self.data = data
        self.network = network
        self._env = dict(os.environ, CONTAINERS_CONF=str(containers_conf))
        self._global = [
            "podman",
            "--root",
            str(storage / "podman"),
            "--runroot",
            str(storage / "podman-run"),
            "--storage-driver",
            "vfs",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
        ]

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(*self._global, *args, check=check, env=self._env)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*self._global, *args], env=self._env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    @staticmethod
    def namespaces() -> set[str]:
        """The network namespaces podman holds for its containers (it names them netns-UUID).

        Read from /run/netns rather than asked with ``podman inspect``: each
        podman command first runs every plugin of its networks with VERSION,
        which costs seconds under emulation.
        """
        return {str(p) for p in Path("/run/netns").glob("netns-*")}


class PodmanHost:
    """One image store; a Podman per network, each with a conflist directory of its own.

    podman validates every conflist of its directory on each command, running
    each plugin (and IPAM) with VERSION, so one network per directory keeps
    every command as cheap as a node with one SR-IOV network.
    """

    def __init__(self, base: Path, storage: Path, cni_bin: Path, pf: str) -> None:
        self._base, self._storage, self._cni_bin = base, storage, cni_bin
        self.data = base / "data"
        self.conf = render_conflist(pf, self.data)

    def network(self, conf: dict[str, Any]) -> Podman:
        name = conf["name"]
        conf_dir = self._base / f"net.d-{name}"
        conf_dir.mkdir(exist_ok=True)
        (conf_dir / f"10-{name}.conflist").write_text(json.dumps(conf))
        containers_conf = self._base / f"containers-{name}.conf"
        containers_conf.write_text(render_containers_conf(self._cni_bin, conf_dir))
        return Podman(self._storage, containers_conf, self.data, name)


# --- oracles -------------------------------------------------------------------


def in_netns(netns: str, *cmd: str) -> str:
    """Run ``cmd`` in the network namespace at path ``netns`` (not through the runtime)."""
    return run("nsenter", f"--net={netns}", *cmd).stdout


def pod_eth0(netns: str) -> dict[str, Any]:
    """``ip -j -d addr show eth0`` in ``netns``: MAC, PCI parent, addresses, flags."""
    [link] = json.loads(in_netns(netns, "ip", "-j", "-d", "addr", "show", "dev", "eth0"))
    return dict(link)


def ipv4(link: dict[str, Any]) -> str:
    [addr] = [a for a in link["addr_info"] if a["family"] == "inet"]
    return f"{addr['local']}/{addr['prefixlen']}"


def assert_pod_carrier(netns: str) -> None:
    """The pod's eth0 has carrier as soon as the runtime says the pod is up.

    No wait: ADD returns only once a VF has carrier while its PF has
    (sriov_cni/plugin/carrier.py), and a pod's first connection does not
    wait either.  A freshly created igbvf VF left to itself gets carrier
    10 s or more after its first open.
    """
    flags = pod_eth0(netns)["flags"]
    assert "LOWER_UP" in flags, f"eth0 in {netns} has no carrier after ADD returned: {flags}"


def assert_pings(netns: str, dst: str) -> None:
    """From the pod at ``netns``, three pings to ``dst``, every one answered.

    Sent from the pod's network namespace with the node's ping: the same
    path through the VFs as the container's own, without depending on what
    the image or the runtime's exec provide.
    """
    proc = subprocess.run(
        ["nsenter", f"--net={netns}", "ping", "-c", "3", "-W", "5", dst.split("/")[0]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and " 0% packet loss" in proc.stdout, f"{netns} -> {dst}: {proc.stdout}{proc.stderr}"


def vf_picture(pf: str) -> dict[int, dict[str, Any]]:
    """Per VF index: the PF's vfinfo and the VF netdev as the host sees it (None while in a pod)."""
    [link] = json.loads(run("ip", "-j", "-d", "link", "show", "dev", pf).stdout)
    out: dict[int, dict[str, Any]] = {}
    for info in link.get("vfinfo_list", []):
        vf = int(info["vf"])
        net = Path(f"/sys/class/net/{pf}/device/virtfn{vf}/net")
        names = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
        netdev = None
        if names:
            [host] = json.loads(run("ip", "-j", "link", "show", "dev", names[0]).stdout)
            netdev = {"ifname": host["ifname"], "address": host["address"], "mtu": host["mtu"]}
        out[vf] = {"vfinfo": dict(info), "netdev": netdev}
    return out


def _but_address(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k != "address"}


def assert_as_found(after: dict[int, dict[str, Any]], before: dict[int, dict[str, Any]]) -> None:
    """Every VF is back: same netdev (name, MAC, MTU) on the host and the same PF-side settings.

    With no admin MAC igb reports the MAC the VF programmed itself (zero
    before igbvf first opened, the netdev's own MAC after), so either counts
    as "no admin MAC".
    """
    assert after.keys() == before.keys()
    for vf, was in before.items():
        now = after[vf]
        assert now["netdev"] == was["netdev"], (vf, now, was)
        assert _but_address(now["vfinfo"]) == _but_address(was["vfinfo"]), (vf, now, was)
        assert now["vfinfo"]["address"] in (was["vfinfo"]["address"], was["netdev"]["address"]), (vf, now, was)


def records(data_dir: Path) -> list[str]:
    """The VFs the plugin's store holds under ``data_dir`` (see render_conflist)."""
    return sorted(p.stem for p in (data_dir / "sriov" / "vfs").glob("*.json"))


def leases(data_dir: Path) -> list[str]:
    """The addresses sriov-ipam holds under ``data_dir``: one file per address, as host-local."""
    held = []
    for path in (data_dir / "ipam").glob("*/*"):
        try:
            held.append(str(ipaddress.ip_address(path.name)))
        except ValueError:
            continue  # its lock, last-reserved and per-attachment index files
    return sorted(held)
