"""sriov_cni's RDMA code on a VF whose RDMA device hangs off its PCI function, as an mlx5, irdma or bnxt_re VF's does.

Real: Linux 7.3 (rig.py --kernel experimental), its ib_core, ib_uverbs and
nldev, igbvf VFs of the emulated 82576, the plugin in process with its
real dependencies; iproute2's rdma tool and sysfs are the oracle.
The fixture: no emulated NIC has an RDMA function, and rxe devices have no
PCI parent (test_rdma_kernel.py), so a test-only kernel module,
sriov_rdma_stub (tests/vm/rdmastub/, built by tests/vm/rdmastub.py), stands
in for the VF's hardware RDMA function: each VF it is given gets an
``mlx5_N`` device whose parent is the VF's PCI function, with one RoCE port
bound to the VF's netdev.  It moves no data.

Build the module on the host before booting the guest
(``python3 -m tests.vm.rdmastub``).  What the kernel shows at each step
(sysfs, ``rdma dev`` and ``rdma link``, the uverbs character devices) is
printed to the console as it is read.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.kernel.netns import own_netns_path
from sriov_cni.kernel.rdma import Rdma, move_out, roce_v2_gid_index, vf_rdma_devices, vf_verbs_devices
from tests.support.daemonlib import Daemon
from tests.vm import rdmastub
from tests.vm.plugincalls import cni, ns_path, records
from tests.vm.rdmalib import exclusive_pods
from tests.vm.vmlib import Sriov, vf_pci_dirs, wait_until

pytestmark = [pytest.mark.sriov_vm, pytest.mark.rdma_vm("7.3")]

SYS = Path("/sys")
PCI_DEVICES = SYS / "bus/pci/devices"
# The kernel hands a dead namespace's RDMA devices back from a work item,
# and adds an address's GIDs from one: seen within a second or two.  Only a
# fault takes this long.
BOUND = 60.0
# What the kernel log says when something went wrong in a driver: a WARN_ON,
# an oops, a reference leaked or dropped twice, a netdev held for good.
KERNEL_COMPLAINTS = re.compile(
    r"WARNING:|BUG:|Oops|general protection fault|refcount_t:|unregister_netdevice: waiting"
    r"|list_(add|del) corruption|UBSAN:|KASAN:"
)

# One shell per look, inside the namespace looked from (ip netns exec mounts
# that namespace's own sysfs), for its sysfs and the rdma tool's view.
VIEW_SCRIPT = (
    'echo "@vf"; ls "/sys/bus/pci/devices/$1/infiniband" 2>/dev/null; '
    'echo "@class"; ls /sys/class/infiniband; '
    'echo "@dev"; rdma -j dev; echo; echo "@link"; rdma -j link; echo; '
    'echo "@text"; rdma dev; rdma link'
)
# The GID table of a device's port 1: a process per entry costs minutes under TCG.
GID_SCRIPT = (
    'cd "/sys/class/infiniband/$1/ports/1" && grep -H . gids/* gid_attrs/types/* gid_attrs/ndevs/* 2>/dev/null; true'
)
UNUSED_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
UVERBS_SCRIPT = (
    "ls /dev/infiniband 2>/dev/null; echo @; "
    'for u in /sys/class/infiniband_verbs/uverbs*; do [ -e "$u/ibdev" ] && echo "${u##*/} $(cat "$u/ibdev")"; done; true'
)


def sh(script: str, *args: str, pod: str | None = None) -> str:
    inside = ["ip", "netns", "exec", pod] if pod else []
    return subprocess.run([*inside, "sh", "-c", script, "sh", *args], check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class View:
    """The RDMA devices as one namespace sees them: its sysfs and the rdma tool."""

    vf_dir: list[str]  # /sys/bus/pci/devices/<VF>/infiniband/
    class_dir: list[str]  # /sys/class/infiniband/
    devs: dict[str, int]  # rdma dev: each device's index
    links: dict[str, str | None]  # rdma link: each device's port 1 netdev, where this namespace sees one
    text: str  # all of it as printed


def view(pci: str, pod: str | None = None) -> View:
    out = sh(VIEW_SCRIPT, pci, pod=pod)
    sections: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in out.splitlines():
        if line.startswith("@"):
            lines = sections.setdefault(line[1:], [])
        elif line.strip():
            lines.append(line)
    devs: list[dict[str, Any]] = json.loads("".join(sections["dev"]) or "[]")
    links: list[dict[str, Any]] = json.loads("".join(sections["link"]) or "[]")
    text = "\n".join(
        [
            f"  /sys/bus/pci/devices/{pci}/infiniband/: {sections['vf']}",
            f"  /sys/class/infiniband/: {sections['class']}",
            *(f"  {line}" for line in sections["text"]),
        ]
    )
    return View(
        vf_dir=sections["vf"],
        class_dir=sections["class"],
        devs={str(d["ifname"]): int(d["ifindex"]) for d in devs},
        links={str(p["ifname"]): p.get("netdev") for p in links if p["port"] == 1},
        text=text,
    )


@dataclass(frozen=True)
class Gid:
    gid: str
    type: str
    ndev: str


def gid_table(device: str, pod: str | None = None) -> dict[int, Gid]:
    """The used entries of ``device``'s port 1 GID table, read in ``pod`` (None: the host)."""
    fields: dict[int, dict[str, str]] = {}
    for line in sh(GID_SCRIPT, device, pod=pod).splitlines():
        path, _, value = line.partition(":")
        where, _, n = path.rpartition("/")
        fields.setdefault(int(n), {})[where.rpartition("/")[2]] = value
    return {
        n: Gid(f["gids"], f.get("types", ""), f.get("ndevs", ""))
        for n, f in sorted(fields.items())
        if f["gids"] != UNUSED_GID
    }


def roce_gid(address: str) -> str:
    """An IPv4 address as the GID table writes it: IPv4-mapped IPv6, eight groups of four digits."""
    return ipaddress.IPv6Address(f"::ffff:{address}").exploded


def uverbs(pod: str | None = None) -> tuple[list[str], dict[str, str]]:
    """/dev/infiniband's nodes, and each uverbs class device's RDMA device, as seen in ``pod`` (None: the host)."""
    nodes, _, classes = sh(UVERBS_SCRIPT, pod=pod).partition("@\n")
    return nodes.split(), {u: d for u, _, d in (line.partition(" ") for line in classes.splitlines())}


def uverbs_of(table: dict[str, str], device: str) -> str | None:
    return next((u for u, d in table.items() if d == device), None)


def move_in(device: str, pod: str) -> int:
    """Move ``device`` from the host into ``pod`` as ADD does, by its index; the index."""
    with Rdma() as host:
        index = host.device(device).index
        host.move(index, ns_path(pod))
    return index


def kernel_log_since(marker: str) -> list[str]:
    lines = subprocess.run(["dmesg"], check=True, capture_output=True, text=True).stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.endswith(marker)]
    return lines[starts[-1] + 1 :] if starts else lines


@pytest.fixture
def show(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Print to the console as the test runs (the record the views are kept for), whatever the capture."""

    def out(text: str) -> None:
        with capsys.disabled():
            print(f"\n{text}", flush=True)

    return out


@pytest.fixture(scope="module")
def ko() -> tuple[Path, float]:
    """The module's .ko (built on the host beforehand, so found here) and the seconds it took."""
    start = time.monotonic()
    return rdmastub.build(), time.monotonic() - start


def only_device(pci: str) -> str:
    """The VF's one RDMA device, as its sysfs lists it (the module registers it before insmod returns)."""
    [device] = os.listdir(PCI_DEVICES / pci / "infiniband")
    return device


@dataclass(frozen=True)
class StubVf:
    netdev: str
    pci: str
    rdma: str  # its RDMA device, as the module named it


@pytest.fixture
def stub(
    ko: tuple[Path, float],
    sriov: Sriov,
    igb_pfs: list[str],
    request: pytest.FixtureRequest,
    show: Callable[[str], None],
) -> Iterator[Callable[[int], list[StubVf]]]:
    """``stub(n)``: ``n`` VFs on the first PF, each with the module's RDMA device.

    At teardown the module is unloaded (before ``sriov`` removes the VFs),
    and the test fails if the kernel logged a warning, an oops or a leak
    meanwhile.
    """
    path, seconds = ko
    show(f"{rdmastub.MODULE}: {path} (found or built in {seconds:.1f} s)")
    pf = igb_pfs[0]
    marker = f"sriov-cni test: {request.node.nodeid}"
    Path("/dev/kmsg").write_text(f"{marker}\n")
    with ExitStack() as stack:

        def load(n: int) -> list[StubVf]:
            netdevs = sriov.enable(pf, n)
            pcis = [d.name for d in vf_pci_dirs(pf)]
            stack.enter_context(rdmastub.loaded(path, pcis))
            return [StubVf(netdev, pci, only_device(pci)) for netdev, pci in zip(netdevs, pcis, strict=True)]

        yield load
    complaints = [line for line in kernel_log_since(marker) if KERNEL_COMPLAINTS.search(line)]
    assert complaints == [], "\n".join(complaints)


@pytest.fixture
def pods() -> Iterator[Callable[[], str]]:
    """Exclusive mode; ``pods()`` then makes a namespace (see rdmalib)."""
    with exclusive_pods("stubpod") as pod:
        yield pod


def test_each_vf_gets_a_device_under_its_pci_function(
    stub: Callable[[int], list[StubVf]], show: Callable[[str], None]
) -> None:
    vfs = stub(2)
    host = view(vfs[0].pci)
    show(f"host, {vfs[0].pci}:\n{host.text}")
    assert sorted(host.devs) == sorted(vf.rdma for vf in vfs)
    for vf in vfs:
        assert re.fullmatch(r"mlx5_\d+", vf.rdma)
        assert (Path("/sys/class/infiniband") / vf.rdma).resolve().parent.parent == (PCI_DEVICES / vf.pci).resolve()
        assert (SYS / "class/infiniband" / vf.rdma / "ports/1/link_layer").read_text().strip() == "Ethernet"
        assert host.links[vf.rdma] == vf.netdev
        # The plugin finds each VF's device through sysfs.
        assert vf_rdma_devices(SYS, vf.pci) == [vf.rdma]
        # And, through ib_uverbs' class, by its character device.
        assert list(vf_verbs_devices(SYS, vf.pci).values()) == [vf.rdma]
    with Rdma() as handle:
        assert {d.name: d.index for d in handle.devices()} == host.devs


def test_an_address_gets_roce_v1_and_v2_gids(stub: Callable[[int], list[StubVf]], show: Callable[[str], None]) -> None:
    [vf] = stub(1)
    subprocess.run(["ip", "link", "set", vf.netdev, "up"], check=True)
    subprocess.run(["ip", "addr", "add", "192.0.2.10/24", "dev", vf.netdev], check=True)
    wanted = roce_gid("192.0.2.10")

    def entries() -> set[str]:
        return {g.type for g in gid_table(vf.rdma).values() if g.gid == wanted and g.ndev == vf.netdev}

    wait_until(lambda: entries() == {"IB/RoCE v1", "RoCE v2"}, BOUND, f"{vf.rdma}'s GIDs of 192.0.2.10")
    table = gid_table(vf.rdma)
    show(f"{vf.rdma} GID table, 192.0.2.10 on {vf.netdev}:\n" + "\n".join(f"  {n}: {g}" for n, g in table.items()))


def test_moves_into_a_pod_and_back_in_exclusive_mode(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], show: Callable[[str], None]
) -> None:
    [vf] = stub(1)
    pod = pods()
    before = view(vf.pci)
    show(f"before the move, host:\n{before.text}")

    # ADD's order: the RDMA device into the pod, then the netdev.
    index = move_in(vf.rdma, pod)
    subprocess.run(["ip", "link", "set", vf.netdev, "netns", pod], check=True)
    host_view, pod_view = view(vf.pci), view(vf.pci, pod)
    show(f"in the pod, host:\n{host_view.text}\nin the pod, pod:\n{pod_view.text}")
    # The same index in the pod: what the plugin finds it by.
    assert pod_view.devs == {vf.rdma: index} and pod_view.vf_dir == [vf.rdma]
    assert pod_view.links == {vf.rdma: vf.netdev}
    assert vf.rdma not in host_view.devs and vf.rdma not in host_view.class_dir
    # The host's sysfs no longer lists it under its VF: the class directory
    # is filtered by the namespace of the sysfs mount.
    show(f"host's /sys/bus/pci/devices/{vf.pci}/infiniband/ while the device is in the pod: {host_view.vf_dir}")
    assert host_view.vf_dir == []
    assert vf_rdma_devices(SYS, vf.pci) == []
    # ib_uverbs' class is not namespaced: the host still finds it there.
    assert list(vf_verbs_devices(SYS, vf.pci).values()) == [vf.rdma]

    # The RoCE v2 GID index the plugin tells a pod, read in the pod's sysfs.
    subprocess.run(["ip", "-n", pod, "link", "set", vf.netdev, "up"], check=True)
    subprocess.run(["ip", "-n", pod, "addr", "add", "192.0.2.20/24", "dev", vf.netdev], check=True)
    told = roce_v2_gid_index(ns_path(pod), SYS, vf.rdma, vf.netdev, [ipaddress.IPv4Address("192.0.2.20")], BOUND)
    table = gid_table(vf.rdma, pod)
    show(f"{vf.rdma} GID table in the pod:\n" + "\n".join(f"  {n}: {g}" for n, g in table.items()))
    assert isinstance(told, int), told
    assert table[told] == Gid(roce_gid("192.0.2.20"), "RoCE v2", vf.netdev)

    # DEL's order: the RDMA device back from inside the pod, then the netdev.
    move_out(ns_path(pod), index, own_netns_path())
    subprocess.run(["ip", "-n", pod, "link", "set", vf.netdev, "netns", "1"], check=True)
    after = view(vf.pci)
    show(f"moved back, host:\n{after.text}")
    assert after.vf_dir == [vf.rdma] and vf.rdma in after.devs
    assert after.links[vf.rdma] == vf.netdev
    assert view(vf.pci, pod).devs == {}


def network(data_dir: Path, vf: StubVf, info: Path | None = None) -> dict[str, Any]:
    """The plugin's network for ``vf`` (as a device plugin names it) with ``"rdma": "required"``."""
    ipam = {"type": "sriov-ipam", "dataDir": str(data_dir / "ipam"), "ranges": [[{"subnet": "10.83.0.0/24"}]]}
    conf: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "stubnet",
        "type": "sriov",
        "deviceID": vf.pci,
        "dataDir": str(data_dir),
        "rdma": "required",
        "ipam": ipam,
    }
    if info is not None:
        conf["runtimeConfig"] = {"CNIDeviceInfoFile": str(info)}
    return conf


def test_the_plugin_moves_the_vf_device_in_and_out(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], tmp_path: Path, show: Callable[[str], None]
) -> None:
    """ADD, CHECK and DEL with ``"rdma": "required"``; then DEL after the pod's namespace is gone."""
    [vf] = stub(1)
    info = tmp_path / "devinfo.json"
    conf = network(tmp_path, vf, info)
    pod = pods()
    rc, res = cni("ADD", conf, container="stub1", netns=ns_path(pod))
    assert rc == 0, res
    address = res["ips"][0]["address"].split("/")[0]
    told = json.loads(info.read_text())["pci"]
    table = gid_table(vf.rdma, pod)
    show(f"device-info: {told}\n{vf.rdma} GID table in the pod:\n" + "\n".join(f"  {n}: {g}" for n, g in table.items()))
    assert told["rdma-device"] == vf.rdma
    assert table[int(told["rdma-gid-index"])] == Gid(roce_gid(address), "RoCE v2", "net1")
    assert list(view(vf.pci, pod).devs) == [vf.rdma]
    assert vf.rdma not in view(vf.pci).devs
    rc, out = cni("CHECK", dict(conf, prevResult=res), container="stub1", netns=ns_path(pod))
    assert rc == 0, out
    rc, res = cni("DEL", conf, container="stub1", netns=ns_path(pod))
    assert rc == 0, res
    back = view(vf.pci)
    assert back.vf_dir == [vf.rdma] and back.links[vf.rdma] == vf.netdev

    # The pod's namespace dies first: the kernel hands the device back, and
    # DEL finds it by its VF in the host's sysfs.
    dead = pods()
    rc, res = cni("ADD", conf, container="stub2", netns=ns_path(dead))
    assert rc == 0, res
    subprocess.run(["ip", "netns", "del", dead], check=True)
    rc, res = cni("DEL", conf, container="stub2", netns=ns_path(dead))
    assert rc == 0, res
    back = view(vf.pci)
    show(f"after DEL of a dead pod, host:\n{back.text}")
    assert back.vf_dir == [vf.rdma] and back.links[vf.rdma] == vf.netdev
    assert records(tmp_path) == []


def test_the_daemon_gives_back_the_vf_and_its_device_of_a_pod_that_died_without_del(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], tmp_path: Path, show: Callable[[str], None]
) -> None:
    [vf] = stub(1)
    info = tmp_path / "devinfo.json"
    conf = network(tmp_path, vf, info)
    with Daemon(tmp_path / "run", "--data-dir", str(tmp_path), "--no-nri"):
        dead = pods()
        rc, res = cni("ADD", conf, container="lost", netns=ns_path(dead))
        assert rc == 0, res
        assert list(view(vf.pci, dead).devs) == [vf.rdma] and info.exists()
        # No DEL comes: the namespace goes, and the kernel hands the device
        # and the VF's netdev back, the device first.
        subprocess.run(["ip", "netns", "del", dead], check=True)
        wait_until(lambda: records(tmp_path) == [], BOUND, "the daemon to give the VF back")
    back = view(vf.pci)
    show(f"given back by the daemon, host:\n{back.text}")
    assert back.vf_dir == [vf.rdma] and back.links[vf.rdma] == vf.netdev
    assert not info.exists()
    assert list((tmp_path / "ipam" / "stubnet").glob("10.*")) == []


def test_the_device_goes_when_its_vf_is_unbound(
    stub: Callable[[int], list[StubVf]], show: Callable[[str], None]
) -> None:
    [vf] = stub(1)
    (SYS / "bus/pci/drivers/igbvf/unbind").write_text(vf.pci)
    gone = view(vf.pci)
    show(f"{vf.pci} unbound from igbvf, host:\n{gone.text}")
    assert vf.rdma not in gone.devs and gone.vf_dir == []
    assert not (SYS / "class/infiniband" / vf.rdma).exists()
    assert vf_rdma_devices(SYS, vf.pci) == []

    # Bound again, the VF gets a device again, on its new netdev.
    (SYS / "bus/pci/drivers/igbvf/bind").write_text(vf.pci)
    [netdev] = os.listdir(PCI_DEVICES / vf.pci / "net")
    back = view(vf.pci)
    show(f"{vf.pci} bound again, host:\n{back.text}")
    [device] = back.vf_dir
    assert back.links[device] == netdev


def test_a_device_in_a_pod_goes_with_its_vf(
    stub: Callable[[int], list[StubVf]],
    pods: Callable[[], str],
    sriov: Sriov,
    igb_pfs: list[str],
    show: Callable[[str], None],
) -> None:
    """sriov_numvfs back to 0 while the VF's device is in a pod: it goes from the pod, the module stays sound."""
    [vf] = stub(1)
    pod = pods()
    move_in(vf.rdma, pod)
    sriov.disable(igb_pfs[0])
    inside = view(vf.pci, pod)
    show(f"VFs removed while {vf.rdma} is in the pod, pod:\n{inside.text}")
    assert inside.devs == {} and view(vf.pci).devs == {}


def test_unloads_with_devices_on_the_host_and_in_a_pod(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str]
) -> None:
    on_host, in_pod = stub(2)
    pod = pods()
    move_in(in_pod.rdma, pod)
    rdmastub.unload()
    assert not rdmastub.is_loaded()
    assert view(on_host.pci).devs == {} and view(in_pod.pci, pod).devs == {}


def test_uverbs_numbers_across_a_removal_and_a_move(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], show: Callable[[str], None]
) -> None:
    """Review finding 8: devices a, b and c; b goes; c moves into a pod.  Which uverbsN is whose, before and after."""
    a, b, c = stub(3)
    pod = pods()
    before = uverbs()
    (SYS / "bus/pci/drivers/igbvf/unbind").write_text(b.pci)
    removed = uverbs()
    move_in(c.rdma, pod)
    host_after, pod_after = uverbs(), uverbs(pod)
    show(
        f"a={a.rdma} b={b.rdma} c={c.rdma}\n"
        f"  created:          /dev/infiniband {before[0]}, class {before[1]}\n"
        f"  b removed:        /dev/infiniband {removed[0]}, class {removed[1]}\n"
        f"  c moved, host:    /dev/infiniband {host_after[0]}, class {host_after[1]}\n"
        f"  c moved, pod:     /dev/infiniband {pod_after[0]}, class {pod_after[1]}"
    )
    assert uverbs_of(removed[1], b.rdma) is None
    assert uverbs_of(host_after[1], a.rdma) == uverbs_of(before[1], a.rdma)
    # c's entry was removed and added again on the move, with the lowest
    # free number: b's.  A uverbsN resolved before the move names another device.
    assert uverbs_of(host_after[1], c.rdma) == uverbs_of(before[1], b.rdma) != uverbs_of(before[1], c.rdma)
    # Neither /dev nor ib_uverbs' class is per namespace.
    assert pod_after == host_after


def test_the_pod_is_told_the_uverbs_device_its_device_has_after_the_move(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], tmp_path: Path, show: Callable[[str], None]
) -> None:
    """ADD of c after b went, as in the test above: the device-info file names c's uverbsN after the move."""
    _, b, c = stub(3)
    (SYS / "bus/pci/drivers/igbvf/unbind").write_text(b.pci)
    before = uverbs_of(uverbs()[1], c.rdma)
    info = tmp_path / "devinfo.json"
    conf = network(tmp_path, c, info)
    pod = pods()
    rc, res = cni("ADD", conf, container="stub3", netns=ns_path(pod))
    assert rc == 0, res
    told = json.loads(info.read_text())["pci"]
    after = uverbs_of(uverbs()[1], c.rdma)
    show(f"{c.rdma}: {before} before ADD, {after} after; device-info: {told}")
    assert told["rdma-device"] == c.rdma
    assert told["rdma-uverbs-device"] == f"/dev/infiniband/{after}" and after != before
    rc, res = cni("DEL", conf, container="stub3", netns=ns_path(pod))
    assert rc == 0, res


def test_the_plugin_gives_back_a_device_the_pod_renamed(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], tmp_path: Path, show: Callable[[str], None]
) -> None:
    """A pod's CAP_NET_ADMIN is enough to rename its device; DEL finds it by index and renames it back."""
    [vf] = stub(1)
    conf = network(tmp_path, vf)
    pod = pods()
    rc, res = cni("ADD", conf, container="stub4", netns=ns_path(pod))
    assert rc == 0, res
    subprocess.run(["ip", "netns", "exec", pod, "rdma", "dev", "set", vf.rdma, "name", "podrdma"], check=True)
    assert list(view(vf.pci, pod).devs) == ["podrdma"]
    rc, res = cni("DEL", conf, container="stub4", netns=ns_path(pod))
    assert rc == 0, res
    back = view(vf.pci)
    show(f"DEL after the pod renamed {vf.rdma} podrdma, host:\n{back.text}")
    assert back.vf_dir == [vf.rdma] and back.links[vf.rdma] == vf.netdev


def test_the_plugin_gives_back_a_device_whose_name_the_host_took(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], tmp_path: Path, show: Callable[[str], None]
) -> None:
    """While a's device is in the pod, b's is made again and takes its name: 7.3 names devices per namespace."""
    a, b = stub(2)
    conf = network(tmp_path, a)
    pod = pods()
    rc, res = cni("ADD", conf, container="stub6", netns=ns_path(pod))
    assert rc == 0, res
    (SYS / "bus/pci/drivers/igbvf/unbind").write_text(b.pci)
    (SYS / "bus/pci/drivers/igbvf/bind").write_text(b.pci)
    # b's new netdev took the lowest free name, a's from before ADD, which
    # DEL gives back to a's netdev: out of the way, this test is of RDMA names.
    [b_netdev] = os.listdir(PCI_DEVICES / b.pci / "net")
    subprocess.run(["ip", "link", "set", b_netdev, "name", "stubvf1"], check=True)
    again = only_device(b.pci)
    assert again == a.rdma
    rc, res = cni("DEL", conf, container="stub6", netns=ns_path(pod))
    assert rc == 0, res
    back = view(a.pci)
    show(f"{b.pci}'s device made again as {again} while {a.rdma} is in the pod; after DEL, host:\n{back.text}")
    # Back under its VF and bound to its netdev, under another name.
    [name] = back.vf_dir
    assert name != a.rdma and back.links[name] == a.netdev


def test_the_plugin_deletes_a_pod_whose_vf_left_its_driver(
    stub: Callable[[int], list[StubVf]], pods: Callable[[], str], tmp_path: Path, show: Callable[[str], None]
) -> None:
    """The VF unbound from igbvf while its device is in the pod: both its netdev and its RDMA device are gone."""
    [vf] = stub(1)
    conf = network(tmp_path, vf)
    pod = pods()
    rc, res = cni("ADD", conf, container="stub5", netns=ns_path(pod))
    assert rc == 0, res
    (SYS / "bus/pci/drivers/igbvf/unbind").write_text(vf.pci)
    assert view(vf.pci, pod).devs == {}
    rc, res = cni("DEL", conf, container="stub5", netns=ns_path(pod))
    show(f"DEL with {vf.pci} unbound: status {rc}, {res}")
    assert rc == 0, res
    assert records(tmp_path) == []


def test_in_shared_mode_required_is_refused_and_auto_leaves_the_device_where_every_pod_sees_it(
    stub: Callable[[int], list[StubVf]], netns: Callable[[], str], tmp_path: Path
) -> None:
    """Shared mode, the kernel's default: ``required`` promises the pod a device of its own, which it cannot get."""
    [vf] = stub(1)
    with Rdma() as host:
        assert host.netns_mode() == "shared"
    pod = netns()
    rc, res = cni("ADD", network(tmp_path, vf), container="req", netns=ns_path(pod))
    assert rc != 0 and res["code"] == 100 and "netns mode is shared" in res["msg"], res
    assert records(tmp_path) == []
    rc, res = cni("ADD", dict(network(tmp_path, vf), rdma="auto"), container="auto", netns=ns_path(pod))
    assert rc == 0, res
    # Nothing moved: the host sees it still, and so does the pod.
    assert vf.rdma in view(vf.pci).devs and vf.rdma in view(vf.pci, pod).devs
    rc, res = cni("DEL", dict(network(tmp_path, vf), rdma="auto"), container="auto", netns=ns_path(pod))
    assert rc == 0, res
    assert records(tmp_path) == []
