"""Netlink behaviour the plugin depends on, against the real kernel in throwaway namespaces.

These are the kernel answers a fake cannot give: a rename the target
namespace refuses after the move, EBUSY for a change the device cannot take
while up, altnames going away and coming back.  The VF netdevs are veths
from :class:`pluginlib.Node`; ``ip -j`` is the oracle.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from sriov_cni.cni import Code
from sriov_cni.kernel import netlink
from sriov_cni.plugin import attach
from tests.support.pluginlib import Node, Ready, altname, link, link_names, sh


def test_a_refused_rename_leaves_the_link_in_its_namespace_with_its_altnames(node: Node) -> None:
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    ns = os.path.basename(pod)
    sh("ip", "-n", ns, "link", "add", "net1", "type", "veth", "peer", "name", "net1peer")

    # net1 is taken in the pod: the kernel moves the link under its own
    # name, then refuses the rename.
    with pytest.raises(netlink.LinkExists):
        attach._move(None, vf.netdev, pod, "net1")

    assert link_names(ns) == {"lo", "net1", "net1peer"}
    home = link(vf.netdev)
    assert home is not None, "the link stayed in the pod under its host name"
    assert home["altnames"] == [altname(vf.netdev)]


def test_altnames_are_dropped_going_either_way(node: Node) -> None:
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    ns = os.path.basename(pod)

    attach._move(None, vf.netdev, pod, "net1")
    inside = link("net1", ns)
    assert inside is not None and "altnames" not in inside
    assert link(vf.netdev) is None
    # The pod's own altname, as a udev rule or an agent in it would add.
    sh("ip", "-n", ns, "link", "property", "add", "dev", "net1", "altname", f"{vf.netdev}-pod")

    attach._move(pod, "net1", None, vf.netdev)
    home = link(vf.netdev)
    assert home is not None and "altnames" not in home
    assert link_names(ns) == {"lo"}


def test_a_kernel_ebusy_answer_is_busy(node: Node) -> None:
    pod = node.pod()
    ns = os.path.basename(pod)
    sh("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d0peer")
    sh("ip", "-n", ns, "link", "add", "v0", "link", "d0", "type", "macvlan")
    sh("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
    with netlink.open_namespace(pod) as inside:
        port, bridge = inside.find("d0"), inside.find("br0")
        assert port is not None and bridge is not None
        # The macvlan holds d0's receive hook, so the bridge cannot take
        # it: the kernel answers EBUSY, as drivers do while busy with a VF.
        # Every link request goes through this one path.
        with pytest.raises(netlink.Busy) as err:
            inside._set(port.index, "enslaving d0", [("IFLA_MASTER", bridge.index)])
    assert err.value.errno == errno.EBUSY
    assert "master" not in (link("d0", ns) or {})


def test_admin_mac_is_retried_while_the_driver_answers_busy(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    # i40e answers EBUSY while it applies a VF MAC; ADD must wait it out.
    pf = node.add_pf(1)
    pod = node.pod()
    node.mac_retry_delay = 0
    answers = [netlink.Busy("setting admin MAC: Device or resource busy", 16)] * 3
    set_mac = node.fake.set_mac

    def busy_then_done(pf_name: str, vf: int, mac: str) -> None:
        if answers:
            node.fake.calls.append(("mac", pf_name, vf, mac))
            raise answers.pop()
        set_mac(pf_name, vf, mac)

    monkeypatch.setattr(node.fake, "set_mac", busy_then_done)
    mac = "02:aa:bb:cc:dd:01"
    node.add(node.conf(mac=mac), netns=pod)

    assert [c for c in node.fake.calls if c[0] == "mac"] == [("mac", pf.name, 0, mac)] * 4
    state: dict[str, Any] = node.fake.state[pf.name][0]
    assert state["mac"] == mac
    inside = link("net1", os.path.basename(pod))
    assert inside is not None and inside["address"] == mac


def test_admin_mac_is_read_back_until_the_driver_shows_it(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    # iavf accepts a VF MAC and applies it later: the request's success is
    # not enough, the PF's reading must show it before the netdev is set.
    pf = node.add_pf(1)
    pod = node.pod()
    node.mac_retry_delay = 0
    ignored = [2]
    set_mac = node.fake.set_mac

    def late(pf_name: str, vf: int, mac: str) -> None:
        if ignored[0]:
            ignored[0] -= 1
            node.fake.calls.append(("mac", pf_name, vf, mac))
            return
        set_mac(pf_name, vf, mac)

    monkeypatch.setattr(node.fake, "set_mac", late)
    mac = "02:aa:bb:cc:dd:02"
    node.add(node.conf(mac=mac), netns=pod)

    assert [c for c in node.fake.calls if c[0] == "mac"] == [("mac", pf.name, 0, mac)] * 3
    assert node.fake.state[pf.name][0]["mac"] == mac


def test_admin_mac_the_driver_never_shows_fails_the_add(ready: Ready, monkeypatch: pytest.MonkeyPatch) -> None:
    node, pod, before = ready
    node.mac_retry_delay = 0
    monkeypatch.setattr(node.fake, "set_mac", lambda pf_name, vf, mac: None)

    res = node.cni("ADD", node.conf(mac="02:aa:bb:cc:dd:03"), netns=pod)

    assert res.rc != 0 and res.code == Code.DEVICE, res.stdout
    assert "did not take admin MAC 02:aa:bb:cc:dd:03" in res.out["msg"]
    assert node.picture() == before
