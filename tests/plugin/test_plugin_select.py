"""Which VF an ADD takes: self-allocation from pfNames/master, or the VF a device plugin chose."""

from __future__ import annotations

import os

import pytest

from tests.support.pluginlib import Node, Outcome, link, link_names


def taken(node: Node, res: Outcome) -> str:
    """The PCI address of the VF an ADD took, from the store's record and the pod's link."""
    return str(res.out["interfaces"][0]["pciID"])


@pytest.mark.parametrize("by", ["name", "pci"])
def test_pf_names_range_takes_vfs_in_order_then_runs_dry(node: Node, by: str) -> None:
    node.add_pf(2)
    pf = node.add_pf(4)
    ref = pf.name if by == "name" else pf.pci
    conf = node.conf("1.1.0", pfNames=[f"{ref}#1-2"])
    pods = [node.pod() for _ in range(3)]

    first = node.add(conf, netns=pods[0], container="a")
    second = node.add(conf, netns=pods[1], container="b")
    third = node.cni("ADD", conf, netns=pods[2], container="c")

    assert [taken(node, first), taken(node, second)] == [pf.vfs[1].pci, pf.vfs[2].pci]
    # The device moved is the one the result names.
    for res, vf, pod in ((first, pf.vfs[1], pods[0]), (second, pf.vfs[2], pods[1])):
        assert vf.netdev not in link_names()
        pod_link = link("net1", os.path.basename(pod))
        assert pod_link is not None
        assert res.out["interfaces"][0]["mac"] == pod_link["address"]
    assert third.rc != 0 and third.code == 101
    assert {pf.vfs[0].netdev, pf.vfs[3].netdev} <= link_names()


def test_pool_spans_pfs_in_order(node: Node) -> None:
    pf0 = node.add_pf(1)
    pf1 = node.add_pf(1)
    conf = node.conf("1.1.0", pfNames=[pf0.name, pf1.pci])
    a = node.add(conf, netns=node.pod(), container="a")
    b = node.add(conf, netns=node.pod(), container="b")
    assert [taken(node, a), taken(node, b)] == [pf0.vfs[0].pci, pf1.vfs[0].pci]


def test_master_is_a_single_pf_pool(node: Node) -> None:
    node.add_pf(2)
    pf = node.add_pf(2)
    conf = node.conf("1.1.0", master=pf.name)
    res = node.add(conf, netns=node.pod())
    assert taken(node, res) == pf.vfs[0].pci
    assert pf.vfs[0].netdev not in link_names()


def test_device_id_takes_that_vf(node: Node) -> None:
    pf = node.add_pf(3)
    res = node.add(node.conf("1.1.0", deviceID=pf.vfs[2].pci.upper()), netns=node.pod())
    assert taken(node, res) == pf.vfs[2].pci
    assert pf.vfs[2].netdev not in link_names()
    assert {pf.vfs[0].netdev, pf.vfs[1].netdev} <= link_names()


def test_pci_bus_id_is_accepted_as_from_multus(node: Node) -> None:
    pf = node.add_pf(3)
    res = node.add(node.conf("1.1.0", pciBusID=pf.vfs[1].pci), netns=node.pod())
    assert taken(node, res) == pf.vfs[1].pci


def test_device_id_precedence(node: Node) -> None:
    pf = node.add_pf(3)
    # runtimeConfig.deviceID (the device plugin's capability) beats deviceID, which beats pciBusID.
    conf = node.conf("1.1.0", deviceID=pf.vfs[0].pci, pciBusID=pf.vfs[1].pci, runtimeConfig={"deviceID": pf.vfs[2].pci})
    assert taken(node, node.add(conf, netns=node.pod(), container="a")) == pf.vfs[2].pci
    conf = node.conf("1.1.0", deviceID=pf.vfs[0].pci, pciBusID=pf.vfs[1].pci)
    assert taken(node, node.add(conf, netns=node.pod(), container="b")) == pf.vfs[0].pci
    # A named VF beats the pool.
    conf = node.conf("1.1.0", pfNames=[pf.name], deviceID=pf.vfs[1].pci)
    assert taken(node, node.add(conf, netns=node.pod(), container="c")) == pf.vfs[1].pci


def test_device_id_of_a_taken_vf_fails_101(node: Node) -> None:
    pf = node.add_pf(2)
    conf = node.conf("1.1.0", deviceID=pf.vfs[0].pci)
    node.add(conf, netns=node.pod(), container="a")
    before = node.picture()
    res = node.cni("ADD", conf, netns=node.pods[0], container="b", ifname="net2")
    assert res.rc != 0 and res.code == 101
    assert pf.vfs[0].pci in res.out["msg"]
    assert node.picture() == before


def test_dpdk_vf_is_configured_on_the_pf_but_not_moved(node: Node) -> None:
    pf = node.add_pf(2, dpdk=(1,))
    vf = pf.vfs[1]
    pod = node.pod()
    before = node.picture()
    conf = node.conf(
        "1.1.0", deviceID=vf.pci, vlan=30, mac="02:00:00:00:d0:01", spoofchk="off", ipam=node.sriov_ipam("10.42.0.0/24")
    )

    res = node.add(conf, netns=pod)

    assert node.fake.state[pf.name][1] == {
        **before["fake"][pf.name][1],
        "vlan": 30,
        "mac": "02:00:00:00:d0:01",
        "spoofchk": False,
    }
    assert link_names(os.path.basename(pod)) == {"lo"}  # nothing moved, nothing configured in the pod
    assert res.out == {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "mac": "02:00:00:00:d0:01", "sandbox": pod, "pciID": vf.pci}],
        "ips": [{"address": "10.42.0.2/24", "gateway": "10.42.0.1", "interface": 0}],
    }
    assert node.records() == [f"{vf.pci}.json"]

    assert node.cni("DEL", conf, netns=pod).rc == 0
    assert node.picture() == before


def test_dpdk_vf_in_a_pool_is_allocatable(node: Node) -> None:
    pf = node.add_pf(1, dpdk=(0,))
    res = node.add(node.conf("1.1.0"), netns=node.pod())
    assert taken(node, res) == pf.vfs[0].pci
    # Without a MAC configured and an all-zero admin MAC there is no MAC to report.
    assert "mac" not in res.out["interfaces"][0]
