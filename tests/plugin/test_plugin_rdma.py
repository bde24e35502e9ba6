"""The ``rdma`` network key on the host: the config, and refusals that leave the node as it was.

Real: the plugin, the host kernel (network namespaces, veths as VFs), and
its answer to NETLINK_RDMA: a kernel without ib_core, as hosts of this
suite have, refuses the socket.  Fixture: the sysfs tree, where a VF's
RDMA devices are directories laid out as mlx5's (``<VF>/infiniband/<name>``),
and the PF side (FakeVfControl).  The moves themselves run against a real
RDMA core in the guests (tests/vm/test_rdma_*.py).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sriov_cni.cni import IPAddress
from sriov_cni.plugin import aside, rdma
from sriov_cni.vfstore import Allocation, FileStore
from tests.support.hostkernel import has_rdma_netlink
from tests.support.pluginlib import Ready, refused


def _rdma_dir(node_sys: Path, pci: str, name: str) -> None:
    (node_sys / "bus" / "pci" / "devices" / pci / "infiniband" / name).mkdir(parents=True)


def test_an_unknown_mode_is_refused(ready: Ready) -> None:
    node, pod, before = ready
    res = node.cni("ADD", node.conf(rdma="exclusive"), netns=pod)
    refused(res, 7)
    assert '"auto", "required", "off" or "soft"' in res.out["msg"]
    assert node.picture() == before


@pytest.mark.parametrize("mode", [None, "auto", "off"])
def test_a_vf_without_rdma_is_attached_as_before(ready: Ready, mode: str | None) -> None:
    node, pod, _ = ready
    keys = {} if mode is None else {"rdma": mode}
    res = node.add(node.conf(**keys), netns=pod)
    assert res.out["interfaces"][0]["name"] == "net1"
    assert node.cni("DEL", node.conf(**keys), netns=pod).rc == 0


def test_required_refuses_a_named_vf_without_rdma(ready: Ready) -> None:
    node, pod, before = ready
    res = node.cni("ADD", node.conf(rdma="required", deviceID=node.pfs[0].vfs[1].pci), netns=pod)
    refused(res, 100)
    assert "has no RDMA device" in res.out["msg"]
    assert node.picture() == before


def test_required_allocates_only_vfs_with_rdma(ready: Ready) -> None:
    """Self-allocation skips VF 0 (no RDMA device); without one anywhere the pool counts as exhausted."""
    node, pod, before = ready
    refused(node.cni("ADD", node.conf(rdma="required"), netns=pod), 101)
    assert node.picture() == before
    _rdma_dir(node.sys, node.pfs[0].vfs[1].pci, "mlx5_1")
    res = node.cni("ADD", node.conf(rdma="required"), netns=pod)
    # The host has no RDMA netlink: refused, but for VF 1, the one with a device.
    refused(res, 100)
    assert node.pfs[0].vfs[1].pci in res.out["msg"]
    assert node.picture() == before


def test_two_rdma_devices_are_refused_with_nothing_moved(ready: Ready) -> None:
    node, pod, before = ready
    for vf in node.pfs[0].vfs:
        _rdma_dir(node.sys, vf.pci, f"mlx5_{vf.index}")
        _rdma_dir(node.sys, vf.pci, f"mlx5_{vf.index + 10}")
    res = node.cni("ADD", node.conf(), netns=pod)
    refused(res, 100)
    assert "is ambiguous" in res.out["msg"]
    assert node.picture() == before


def test_an_rdma_device_the_kernel_cannot_see_is_refused_with_nothing_moved(ready: Ready) -> None:
    """sysfs names an RDMA device, the kernel has no RDMA netlink: a clear error, the VF back as it was."""
    if has_rdma_netlink():
        pytest.fail("this host kernel has RDMA netlink: the case needs a kernel without ib_core")
    node, pod, before = ready
    for vf in node.pfs[0].vfs:
        _rdma_dir(node.sys, vf.pci, f"mlx5_{vf.index}")
    res = node.cni("ADD", node.conf(), netns=pod)
    refused(res, 100)
    assert "no RDMA netlink" in res.out["msg"]
    assert node.picture() == before


def test_soft_without_rdma_netlink_is_refused_and_rolled_back(ready: Ready) -> None:
    """The rxe step comes after the netdev's move: its failure takes the netdev back out of the pod."""
    if has_rdma_netlink():
        pytest.fail("this host kernel has RDMA netlink: the case needs a kernel without ib_core")
    node, pod, before = ready
    res = node.cni("ADD", node.conf(rdma="soft"), netns=pod)
    refused(res, 100)
    assert "Soft-RoCE" in res.out["msg"]
    assert node.picture() == before


def test_soft_names_are_unique_per_vf() -> None:
    assert rdma.soft_name("0000:01:10.0") == "rxe_0000_01_10_0"
    assert rdma.soft_name("0000:01:10.0") != rdma.soft_name("0000:01:10.2")


@pytest.mark.parametrize("addresses", [[], [ipaddress.ip_address("fe80::1")]])
def test_no_gid_index_without_an_address(tmp_path: Path, addresses: list[IPAddress]) -> None:
    """IPAM gave no address (or only a link-local one): no index, and no namespace entered (it does not exist)."""
    alloc = Allocation("0000:01:10.0", "0000:01:00.0", "eth0", 0, "n", "c", "net1", str(tmp_path / "no-netns"), None)
    assert rdma.gid_index(alloc, "mlx5_0", addresses, tmp_path) is None


def test_a_vf_whose_rdma_device_another_namespace_holds_is_set_aside_for_the_next(ready: Ready) -> None:
    """Exclusive mode hides a moved device from the host's sysfs; ib_uverbs' entry (fixture) still names it.

    The pod would get the VF without its device: the VF is set aside and
    the next one, which has no RDMA device, serves the pod.
    """
    node, pod, _ = ready
    vf0, vf1 = node.pfs[0].vfs
    verbs = node.sys / "bus" / "pci" / "devices" / vf0.pci / "infiniband_verbs" / "uverbs3"
    verbs.mkdir(parents=True)
    (verbs / "ibdev").write_text("mlx5_0\n")
    res = node.add(node.conf(cniVersion="1.1.0"), netns=pod)
    assert res.out["interfaces"][0]["pciID"] == vf1.pci
    record = FileStore(node.data_dir).aside()[vf0.pci]
    assert record.reason == aside.RDMA_ELSEWHERE and "mlx5_0 is in another network namespace" in record.detail


def test_an_infiniband_vf_is_refused_naming_ib_sriov_cni(ready: Ready) -> None:
    node, pod, before = ready
    vf = node.pfs[0].vfs[0]
    assert vf.netdev is not None
    (node.sys / "bus" / "pci" / "devices" / vf.pci / "net" / vf.netdev / "type").write_text("32\n")
    res = node.cni("ADD", node.conf(deviceID=vf.pci), netns=pod)
    refused(res, 100)
    assert "InfiniBand VF" in res.out["msg"] and "ib-sriov-cni" in res.out["details"]
    assert node.picture() == before
    # Without RDMA it is a netdev as any other.
    assert node.cni("ADD", node.conf(deviceID=vf.pci, rdma="off"), netns=pod).rc == 0
