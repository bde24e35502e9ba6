"""sriov_cni.kernel.rdma against the guest kernel's own RDMA core, on Soft-RoCE devices over igb VFs.

Real: Linux 7.2 or 7.3 (rig.py --kernel sid|experimental), its ib_core,
rdma_rxe and nldev, igbvf VFs of the emulated 82576.  The oracle is
iproute2's ``rdma -j`` tool.  No fixture stands in for the kernel; the rxe
devices stand in for a VF's hardware RDMA function (which no emulated NIC
has): unlike an mlx5 VF's, they have no PCI parent, so sysfs lists none.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sriov_cni.kernel.netns import own_netns_path
from sriov_cni.kernel.nlerrors import Busy, InvalidArgument, LinkExists, LinkNotFound, NotSupported
from sriov_cni.kernel.rdma import Rdma, move_out, vf_rdma_devices
from sriov_cni.node.rdmamode import EXCLUSIVE_OPTION, OPTION_FILE
from sriov_cni.plugin import rdma as plugin_rdma
from sriov_cni.vfstore import Allocation
from tests.vm.nodecommand import Node
from tests.vm.rdmalib import back_to_shared, exclusive_pods
from tests.vm.vmlib import Sriov

# Driver tests like every other here; rdma_vm names the kernel they need.
pytestmark = pytest.mark.sriov_vm

SYS = Path("/sys")
# The kernel hands a dead namespace's RDMA devices back to the host from a
# work item; seen within about a second.  Only a fault takes this long.
RETURN_BOUND = 60.0


# The tests that behave alike on both kernels: one per kernel series, each
# run by that kernel's guest (rdma_vm) and deselected by the other's.
BOTH_KERNELS = pytest.mark.parametrize(
    "series", [pytest.param(series, marks=pytest.mark.rdma_vm(series)) for series in ("7.2", "7.3")]
)


def rdma_json(*args: str, netns: str | None = None) -> list[dict[str, object]]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    out = subprocess.run([*prefix, "rdma", "-j", *args], check=True, capture_output=True, text=True).stdout
    return list(json.loads(out or "[]"))


def names(netns: str | None = None) -> set[str]:
    return {str(d["ifname"]) for d in rdma_json("dev", netns=netns)}


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + RETURN_BOUND
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {RETURN_BOUND:.0f} s")
        time.sleep(0.1)


@pytest.fixture
def vfs(sriov: Sriov, igb_pfs: list[str]) -> list[str]:
    vfs = sriov.enable(igb_pfs[0], 2)
    for vf in vfs:
        subprocess.run(["ip", "link", "set", vf, "up"], check=True)
    return vfs


@pytest.fixture
def rxe(vfs: list[str]) -> Iterator[Callable[[str, str], None]]:
    """``rxe(name, netdev)`` adds an rxe device with the rdma tool; every rxe is removed at teardown."""

    def add(name: str, netdev: str) -> None:
        subprocess.run(["rdma", "link", "add", name, "type", "rxe", "netdev", netdev], check=True)

    yield add
    for dev in rdma_json("dev"):
        subprocess.run(["rdma", "link", "delete", str(dev["ifname"])], check=False)


@pytest.fixture
def exclusive() -> Iterator[Callable[[], str]]:
    """Exclusive mode; ``pod()`` then makes a namespace (see rdmalib)."""
    with exclusive_pods("rdpod") as pod:
        yield pod


@BOTH_KERNELS
def test_listing_matches_the_rdma_tool(series: str, vfs: list[str], rxe: Callable[[str, str], None]) -> None:
    rxe("rxa", vfs[0])
    rxe("rxb", vfs[1])
    with Rdma() as host:
        mine = {(d.index, d.name) for d in host.devices()}
        one = {(host.get(index).index, host.get(index).name) for index, _ in mine}
    tools = {(int(str(d["ifindex"])), str(d["ifname"])) for d in rdma_json("dev")}
    assert mine == tools == one
    assert {str(p["netdev"]) for p in rdma_json("link")} == set(vfs)
    # rxe hangs off no PCI function: the VF's sysfs lists no RDMA device.
    for vf in vfs:
        pci = os.path.basename(os.readlink(f"/sys/class/net/{vf}/device"))
        assert vf_rdma_devices(SYS, pci) == []


@BOTH_KERNELS
def test_add_and_delete_an_rxe_link(series: str, vfs: list[str], rxe: Callable[[str, str], None]) -> None:
    with Rdma() as host:
        host.add_link("rxmine", "rxe", vfs[0])
        assert "rxmine" in names()
        with pytest.raises(LinkExists):
            host.add_link("rxmine", "rxe", vfs[1])
        # No driver registers that link type (nor a module named for it).
        with pytest.raises(InvalidArgument):
            host.add_link("rxbad", "nosuchtype", vfs[1])
        host.delete_link("rxmine")
        assert "rxmine" not in names()
        with pytest.raises(LinkNotFound):
            host.delete_link("rxmine")


@BOTH_KERNELS
def test_the_netns_mode(series: str, exclusive: Callable[[], str]) -> None:
    with Rdma() as host:
        assert host.netns_mode() == "exclusive"
        assert subprocess.run(["rdma", "system"], check=True, capture_output=True, text=True).stdout.startswith(
            "netns exclusive"
        )
        exclusive()
        # Another namespace exists now: the kernel refuses the change.
        with pytest.raises(Busy):
            host.set_netns_mode("shared")
        assert host.netns_mode() == "exclusive"


@pytest.mark.rdma_vm("7.2")
def test_rxe_cannot_move_on_72(vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]) -> None:
    """7.2's rxe has no disassociate support: the kernel refuses the move, and the device stays."""
    pod = exclusive()
    rxe("rxstay", vfs[0])
    with Rdma() as host, pytest.raises(NotSupported):
        host.move(host.device("rxstay").index, f"/run/netns/{pod}")
    assert "rxstay" in names()
    assert "rxstay" not in names(pod)


@pytest.mark.rdma_vm("7.3")
def test_moves_in_and_out_of_a_pod_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxmove", vfs[0])
    with Rdma() as host:
        index = host.device("rxmove").index
        host.move(index, f"/run/netns/{pod}")
        assert "rxmove" not in names()
        assert "rxmove" in names(pod)
        # The host no longer sees it: only a request from inside the pod can
        # move it back (nldev refuses an index it does not see with EINVAL).
        with pytest.raises(InvalidArgument):
            host.move(index, own_netns_path())
        assert host.find(index) is None
        with pytest.raises(LinkNotFound):
            host.get(index)
    with Rdma(f"/run/netns/{pod}") as inside:
        assert [d.name for d in inside.devices()] == ["rxmove"]
        # Its index is the one it had on the host.
        assert inside.get(index).name == "rxmove"
    move_out(f"/run/netns/{pod}", index, own_netns_path())
    assert "rxmove" in names()
    assert "rxmove" not in names(pod)


@pytest.mark.rdma_vm("7.3")
def test_a_name_clash_on_the_way_back_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxsame", vfs[0])
    with Rdma() as host:
        index = host.device("rxsame").index
        host.move(index, f"/run/netns/{pod}")
    # The host gets a device of the same name meanwhile.
    rxe("rxsame", vfs[1])
    with pytest.raises(LinkExists) as clash:
        move_out(f"/run/netns/{pod}", index, own_netns_path())
    print(f"name clash: {clash.value}")
    assert "rxsame" in names(pod)


@pytest.mark.rdma_vm("7.3")
def test_a_dead_pods_device_comes_back_renamed_on_a_clash_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxdie", vfs[0])
    with Rdma() as host:
        host.move(host.device("rxdie").index, f"/run/netns/{pod}")
    rxe("rxdie", vfs[1])
    before = names()
    subprocess.run(["ip", "netns", "del", pod], check=True)
    wait_for(lambda: len(names()) == len(before) + 1, "the dead pod's device back on the host")
    back = names() - before
    print(f"returned as {back}")
    with Rdma() as host:
        [returned] = [d for d in host.devices() if d.name in back]
    assert returned.name != "rxdie"


def system_mode() -> str:
    """The mode as iproute2's ``rdma system`` prints it (the oracle)."""
    out = subprocess.run(["rdma", "system"], check=True, capture_output=True, text=True).stdout
    return out.split()[1]


@pytest.fixture
def pods_then_shared() -> Iterator[list[str]]:
    """Namespaces the test adds to the list; at teardown they go and the node is shared again."""
    made: list[str] = []
    yield made
    back_to_shared(made)


@pytest.mark.rdma_vm("7.3")
def test_setup_switches_a_fresh_boot_and_defers_while_a_pod_exists_73(
    node: Node, igb_pfs: list[str], tmp_path: Path, pods_then_shared: list[str]
) -> None:
    """``sriov-cni setup`` with rdmaNetnsMode, as a node runs it: the running kernel read back with ``rdma system``."""
    # The guest booted without the option: the kernel's default.
    assert system_mode() == "shared"
    modprobe = tmp_path / "modprobe.d"

    def setup(mode: str) -> subprocess.CompletedProcess[str]:
        node.config.write_text(f"rdmaNetnsMode: {mode}\npfs: [{{pf: {igb_pfs[0]}, numVfs: 0}}]\n")
        args = ["--state-file", str(node.state), "--data-dir", str(node.data), "--modprobe-dir", str(modprobe)]
        return node.run("setup", "--config", str(node.config), *args)

    first = setup("exclusive")
    assert first.returncode == 0, first.stdout + first.stderr
    assert system_mode() == "exclusive"
    assert (modprobe / OPTION_FILE).read_text() == EXCLUSIVE_OPTION
    again = setup("exclusive")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [line for line in again.stdout.splitlines() if "RDMA" in line and not line.endswith(": unchanged")] == []
    status = node.run("status", "--json", "--data-dir", str(node.data))
    assert json.loads(status.stdout)["rdmaNetnsMode"] == "exclusive"

    # A pod exists: the kernel refuses the switch, setup defers it to the next boot.
    subprocess.run(["ip", "netns", "add", "rdsetup"], check=True)
    pods_then_shared.append("rdsetup")
    deferred = setup("shared")
    print(deferred.stdout)
    assert deferred.returncode == 3, deferred.stdout + deferred.stderr
    assert "not yet as asked: RDMA netns mode: the running kernel stays exclusive" in deferred.stdout
    assert "Traceback" not in deferred.stderr and deferred.stderr == ""
    assert system_mode() == "exclusive"
    assert not (modprobe / OPTION_FILE).exists()


# DEL's give-back (sriov_cni.plugin.rdma.give_back) of a device moved into a
# pod, in each case that left DEL answering "try again" for ever: a record
# made by hand as ADD makes it, an rxe device standing in for the VF's own.


def moved_in(vf: str, name: str, pod: str) -> Allocation:
    """Move ``name`` into ``pod`` as ADD does, and the record ADD keeps of it."""
    path = f"/run/netns/{pod}"
    with Rdma() as host:
        index = host.device(name).index
        host.move(index, path)
    pci = os.path.basename(os.readlink(f"/sys/class/net/{vf}/device"))
    return Allocation(
        vf_pci=pci,
        pf_pci="",
        pf_netdev="",
        vf_index=0,
        network="rdmanet",
        container_id="c1",
        ifname="net1",
        netns=path,
        netns_inode=os.stat(path).st_ino,
        rdma_device=name,
        rdma_index=index,
    )


def host_name(index: int) -> str | None:
    with Rdma() as host:
        found = host.find(index)
    return None if found is None else found.name


@pytest.mark.rdma_vm("7.3")
def test_del_brings_back_a_device_the_pod_renamed_under_its_name_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxren", vfs[0])
    alloc = moved_in(vfs[0], "rxren", pod)
    subprocess.run(["ip", "netns", "exec", pod, "rdma", "dev", "set", "rxren", "name", "podsown"], check=True)
    assert names(pod) == {"podsown"}
    plugin_rdma.give_back(alloc, SYS)
    assert alloc.rdma_index is not None and host_name(alloc.rdma_index) == "rxren"
    assert names(pod) == set()


@pytest.mark.rdma_vm("7.3")
def test_del_brings_back_a_device_whose_name_the_host_took_meanwhile_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxtaken", vfs[0])
    alloc = moved_in(vfs[0], "rxtaken", pod)
    rxe("rxtaken", vfs[1])
    plugin_rdma.give_back(alloc, SYS)
    assert alloc.rdma_index is not None
    parked = host_name(alloc.rdma_index)
    print(f"came back as {parked} beside the host's own rxtaken")
    assert parked is not None and parked != "rxtaken"
    assert names(pod) == set()


@pytest.mark.rdma_vm("7.3")
def test_del_succeeds_for_a_device_that_went_while_in_the_pod_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxgone", vfs[0])
    alloc = moved_in(vfs[0], "rxgone", pod)
    subprocess.run(["ip", "netns", "exec", pod, "rdma", "link", "delete", "rxgone"], check=True)
    # Gone while the pod lives: DEL succeeds (it answered "try again" for ever).
    plugin_rdma.give_back(alloc, SYS)
    assert "rxgone" not in names()


@pytest.mark.rdma_vm("7.3")
def test_del_after_the_pod_died_renames_the_returned_ibdev_back_73(
    vfs: list[str], rxe: Callable[[str, str], None], exclusive: Callable[[], str]
) -> None:
    pod = exclusive()
    rxe("rxback", vfs[0])
    alloc = moved_in(vfs[0], "rxback", pod)
    rxe("rxback", vfs[1])
    before = names()
    subprocess.run(["ip", "netns", "del", pod], check=True)
    assert alloc.rdma_index is not None
    index = alloc.rdma_index
    wait_for(lambda: host_name(index) is not None, "the dead pod's device back on the host")
    returned = host_name(index)
    assert returned not in before, returned
    # The host's own rxback goes; DEL then gives the pod's device its name back.
    subprocess.run(["rdma", "link", "delete", "rxback"], check=True)
    plugin_rdma.give_back(alloc, SYS)
    assert host_name(index) == "rxback"
