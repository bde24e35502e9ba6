"""Helpers for the ``sriov`` plugin's host tests (fixtures in nodefixtures.py).

Only the PF side of SR-IOV is faked (:class:`tests.support.fakes.FakeVfControl`, an in-memory
:class:`sriov_cni.kernel.netlink.VfControl`): there is no SR-IOV NIC on the host.
Everything else is real: each "VF netdev" is one end of a veth pair in the
test process's network namespace (its peer lives in a per-test namespace,
so deleting that namespace destroys every pair wherever its VF end went),
pods are real named network namespaces, and sysfs is a temporary tree laid
out like the kernel's, whose root the plugin is given (``Node.paths``).

Effects are checked with ``ip -j`` (and ``ip netns exec``), never through
the package under test.

``node``
    A :class:`Node`: ``node.add_pf(n)`` creates a PF with ``n`` VFs,
    ``node.pod()`` a pod network namespace, ``node.conf(...)`` a network
    configuration, ``node.cni(...)`` runs the plugin in-process with the
    fake, ``node.picture()`` is everything a failed call must leave as it was.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sriov_cni.kernel import sysfs
from sriov_cni.paths import Paths
from sriov_cni.plugin import commands
from sriov_cni.vfstore import FileStore
from tests.support.fakes import FakeVfControl

REPO = Path(__file__).resolve().parents[2]
SRIOV_BIN = REPO / "bin" / "sriov"
# Debian's containernetworking-plugins (host-local, libcni 1.1.2).
DEBIAN_CNI_DIR = "/usr/lib/cni"


# --- oracles ------------------------------------------------------------------


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


def ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    cmd = ["ip", "-j"] + (["-n", netns] if netns else []) + list(args)
    out = sh(*cmd).stdout
    parsed: list[dict[str, Any]] = json.loads(out or "[]")
    return parsed


def link(name: str, netns: str | None = None) -> dict[str, Any] | None:
    """``ip -j -d link show dev NAME`` in ``netns`` (None: this namespace), or None if absent."""
    cmd = ["ip", "-j", "-d"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    proc = sh(*cmd, check=False)
    if proc.returncode != 0:
        return None
    [found] = json.loads(proc.stdout)
    return dict(found)


def link_names(netns: str | None = None) -> set[str]:
    return {str(entry["ifname"]) for entry in ip_json("link", "show", netns=netns)}


def addresses(name: str, netns: str) -> set[str]:
    [entry] = ip_json("addr", "show", "dev", name, netns=netns)
    return {
        f"{a['local']}/{a['prefixlen']}"
        for a in entry["addr_info"]
        if a["family"] in ("inet", "inet6") and a.get("scope") != "link"
    }


def routes(netns: str, family: str = "-4") -> list[dict[str, Any]]:
    out = sh("ip", "netns", "exec", netns, "ip", "-j", family, "route", "show").stdout
    parsed: list[dict[str, Any]] = json.loads(out or "[]")
    return parsed


def netdev_view(entry: dict[str, Any]) -> dict[str, Any]:
    """What DEL must restore on a VF netdev, as iproute2 reports it."""
    return {
        "ifname": entry["ifname"],
        "address": entry["address"],
        "mtu": entry["mtu"],
        "promisc": "PROMISC" in entry["flags"],
        "up": "UP" in entry["flags"],
        "ifalias": entry.get("ifalias", ""),
        "altnames": sorted(entry.get("altnames", [])),
    }


def altname(netdev: str) -> str:
    """The altname each host test's VF netdev starts with."""
    return f"{netdev}-path"


def ipam_reservations(data_dir: Path, network: str) -> set[str]:
    """Addresses reserved in a host-local-layout store (host-local and sriov-ipam share it)."""
    directory = data_dir / network
    if not directory.is_dir():
        return set()
    out = set()
    for name in os.listdir(directory):
        try:
            out.add(str(ipaddress.ip_address(name)))
        except ValueError:
            continue
    return out


# --- the node -------------------------------------------------------------------


@dataclass
class VF:
    index: int
    pci: str
    netdev: str | None  # None: bound to a DPDK driver
    pf: PF


@dataclass
class PF:
    name: str
    pci: str
    vfs: list[VF] = field(default_factory=list)


@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str

    @property
    def out(self) -> Any:
        return json.loads(self.stdout) if self.stdout.strip() else None

    @property
    def code(self) -> int:
        return int(self.out["code"])


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.token = uuid.uuid4().hex[:5]
        self.sys = tmp_path / "sys"
        (self.sys / "bus" / "pci" / "devices").mkdir(parents=True)
        (self.sys / "bus" / "pci" / "drivers").mkdir(parents=True)
        (self.sys / "class" / "net").mkdir(parents=True)
        self.paths = Paths(sys=self.sys)
        self.data_dir = tmp_path / "data"
        self.ipam_dir = tmp_path / "ipam"
        self.fake = FakeVfControl()
        # How long DEL and GC wait for a VF's claim, and the pause between
        # attempts at a VF's MAC; a test that waits them out shortens them.
        self.claim_wait = commands.Deps.claim_wait
        self.mac_retry_delay = commands.Deps.mac_retry_delay
        self.carrier_wait = commands.Deps.carrier_wait
        self.add_budget = commands.Deps.add_budget
        self.pfs: list[PF] = []
        self.peer_ns = f"svpeer-{self.token}"
        sh("ip", "netns", "add", self.peer_ns)
        self.pods: list[str] = []
        self._pods = 0

    # -- building

    def _devices(self) -> Path:
        return self.sys / "bus" / "pci" / "devices"

    def _driver_link(self, pci: str, driver: str) -> None:
        (self.sys / "bus" / "pci" / "drivers" / driver).mkdir(exist_ok=True)
        os.symlink(f"../../../bus/pci/drivers/{driver}", self._devices() / pci / "driver")

    def add_pf(self, nvfs: int, *, total: int | None = None, dpdk: tuple[int, ...] = (), driver: str = "fakepf") -> PF:
        """A PF with ``nvfs`` VFs; VF indexes in ``dpdk`` are bound to vfio-pci and have no netdev."""
        n = len(self.pfs)
        vfs = [
            (f"0000:{0x3B + n:02x}:{0x10 + i // 8:02x}.{i % 8}", "vfio-pci" if i in dpdk else "igbvf")
            for i in range(nvfs)
        ]
        return self.add_pf_at(f"0000:{0x3B + n:02x}:00.0", f"sv{self.token}p{n}", vfs, driver=driver, total=total)

    def add_pf_at(
        self,
        pci: str,
        name: str,
        vfs: Sequence[tuple[str, str | None]],
        *,
        driver: str = "fakepf",
        total: int | None = None,
    ) -> PF:
        """A PF at ``pci`` named ``name``; each VF is (PCI address, driver).

        A VF bound to a DPDK driver has no netdev, nor has one with driver
        None (unbound); any other VF's netdev is a veth with a per-run name.
        The PF's default driver is none the plugin knows: the fake PF side
        reports the admin MAC only, never a MAC the VF programmed itself as
        igb would (vfsettings.OWN_MAC_IN_READING).
        """
        n = len(self.pfs)
        pf = PF(name=name, pci=pci)
        pf_dir = self._devices() / pf.pci
        (pf_dir / "net" / pf.name).mkdir(parents=True)
        (pf_dir / "sriov_numvfs").write_text(f"{len(vfs)}\n")
        (pf_dir / "sriov_totalvfs").write_text(f"{total if total is not None else max(len(vfs), 7)}\n")
        self._driver_link(pf.pci, driver)
        os.symlink(f"../../../bus/pci/devices/{pf.pci}", self._mkdir_class(pf.name) / "device")
        for i, (vf_pci, vf_driver) in enumerate(vfs):
            vf_dir = self._devices() / vf_pci
            vf_dir.mkdir()
            os.symlink(f"../{pf.pci}", vf_dir / "physfn")
            os.symlink(f"../{vf_pci}", pf_dir / f"virtfn{i}")
            netdev: str | None = None
            if vf_driver is not None:
                self._driver_link(vf_pci, vf_driver)
            if vf_driver is not None and vf_driver not in sysfs.DPDK_DRIVERS:
                netdev = f"sv{self.token}v{n}{i}"
                (vf_dir / "net" / netdev).mkdir(parents=True)
                sh("ip", "link", "add", netdev, "type", "veth", "peer", "name", f"peer{n}{i}", "netns", self.peer_ns)
                # A distinct, recognisable MAC: the netdev's identity across moves.
                sh(
                    "ip",
                    "link",
                    "set",
                    "dev",
                    netdev,
                    "address",
                    f"02:5f:{self.token[:2]}:{self.token[2:4]}:{n:02x}:{i:02x}",
                )
                # udev gives real VF netdevs altnames (their path names); the
                # plugin must drop them on the way in and put them back.
                sh("ip", "link", "property", "add", "dev", netdev, "altname", altname(netdev))
            pf.vfs.append(VF(index=i, pci=vf_pci, netdev=netdev, pf=pf))
        self.fake.add_pf(pf.name, len(vfs))
        self.pfs.append(pf)
        return pf

    def _mkdir_class(self, name: str) -> Path:
        path = self.sys / "class" / "net" / name
        path.mkdir()
        return path

    def sysfs_rename(self, vf: VF, name: str) -> None:
        """What the kernel's sysfs shows when a VF netdev in the host is renamed."""
        [old] = (self._devices() / vf.pci / "net").iterdir()
        old.rename(old.parent / name)

    def pf_carrier(self, value: str | None) -> None:
        """The first PF's carrier as its sysfs file says (``"1"``, ``"0"``), or no such file (None)."""
        path = self.sys / "class" / "net" / self.pfs[0].name / "carrier"
        if value is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{value}\n")

    def vf_peer(self, vf: int, state: str) -> None:
        """The far end of the first PF's VF ``vf`` veth, ``"down"`` (the VF has no carrier) or ``"up"``."""
        sh("ip", "-n", self.peer_ns, "link", "set", f"peer0{vf}", state)

    def pod(self) -> str:
        name = f"svpod-{self.token}-{self._pods}"
        self._pods += 1
        sh("ip", "netns", "add", name)
        self.pods.append(f"/var/run/netns/{name}")
        return self.pods[-1]

    def cleanup(self) -> None:
        for pod in self.pods:
            sh("ip", "netns", "del", os.path.basename(pod), check=False)
        # Destroys every veth pair, whichever namespace the VF end is in.
        sh("ip", "netns", "del", self.peer_ns, check=False)

    # -- running the plugin

    def conf(self, version: str = "1.0.0", name: str = "sriov-net", **keys: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": version, "name": name, "type": "sriov", "dataDir": str(self.data_dir)}
        named = any(k in keys for k in ("deviceID", "pciBusID", "pfNames", "master"))
        if not named and "deviceID" not in keys.get("runtimeConfig", {}):
            out["pfNames"] = [pf.name for pf in self.pfs]
        out.update(keys)
        return out

    def sriov_ipam(self, subnet: str = "10.40.0.0/24", **keys: Any) -> dict[str, Any]:
        return {"type": "sriov-ipam", "dataDir": str(self.ipam_dir), "ranges": [[{"subnet": subnet, **keys}]]}

    def host_local(self, subnet: str = "10.41.0.0/24", **keys: Any) -> dict[str, Any]:
        return {"type": "host-local", "dataDir": str(self.ipam_dir), "ranges": [[{"subnet": subnet}]], **keys}

    def env(
        self,
        command: str,
        *,
        container: str = "ctr1",
        netns: str = "",
        ifname: str = "net1",
        args: str = "",
        path: str = DEBIAN_CNI_DIR,
    ) -> dict[str, str]:
        return {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_ARGS": args,
            "CNI_PATH": path,
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }

    def deps(self) -> commands.Deps:
        fake = self.fake
        return commands.Deps(
            vf_control=lambda: fake,
            store=FileStore,
            claim_wait=self.claim_wait,
            mac_retry_delay=self.mac_retry_delay,
            carrier_wait=self.carrier_wait,
            add_budget=self.add_budget,
            paths=self.paths,
        )

    def run(self, env: dict[str, str], stdin: bytes) -> Outcome:
        out, err = io.StringIO(), io.StringIO()
        rc = commands.run(env, stdin, out, err, self.deps())
        return Outcome(rc, out.getvalue(), err.getvalue())

    def cni(self, command: str, conf: dict[str, Any] | bytes, **env: Any) -> Outcome:
        stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
        return self.run(self.env(command, **env), stdin)

    def add(self, conf: dict[str, Any], **env: Any) -> Outcome:
        res = self.cni("ADD", conf, **env)
        assert res.rc == 0, res.stdout + res.stderr
        return res

    # -- what must survive a failed call

    def vf_netdevs(self) -> list[str]:
        return [vf.netdev for pf in self.pfs for vf in pf.vfs if vf.netdev]

    def records(self) -> list[str]:
        vfs = self.data_dir / "vfs"
        return sorted(p.name for p in vfs.glob("*.json")) if vfs.is_dir() else []

    def picture(self) -> dict[str, Any]:
        """VF netdevs in the host as iproute2 sees them, store records, fake PF state, pods' links."""
        host = {}
        for name in self.vf_netdevs():
            entry = link(name)
            host[name] = netdev_view(entry) if entry else None
        pods = {pod: sorted(link_names(os.path.basename(pod))) for pod in self.pods}
        return {"host": host, "records": self.records(), "fake": self.fake.snapshot(), "pods": pods}


def refused(res: Outcome, code: int) -> dict[str, Any]:
    """A failed call's answer: a CNI error object with ``code``, a message, nothing else, and no traceback."""
    assert res.rc != 0, res.stdout
    out: dict[str, Any] = res.out
    assert out["code"] == code, out
    assert out["msg"]
    assert set(out) <= {"cniVersion", "code", "msg", "details"}
    assert "Traceback" not in res.stdout + res.stderr
    return out


# The ``ready`` fixture: a node with one PF of two VFs, a pod, and the
# picture to compare with afterwards.
Ready = tuple[Node, str, dict[str, Any]]


def run_bin(env: dict[str, str], stdin: bytes) -> Outcome:
    """The ``bin/sriov`` executable as a runtime runs it."""
    proc = subprocess.run([str(SRIOV_BIN)], input=stdin, env=env, capture_output=True, check=False, timeout=60)
    return Outcome(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
