"""DEL gives a VF back as it was before ADD, whatever its pod changed on it.

Real: the kernel's links in throwaway namespaces, the plugin's netlink and
ethtool requests, the store on disk.  Fixtures: veths stand in for VFs (the
PF side is the fake of :class:`pluginlib.Node`).  The oracle is iproute2
(``ip -j -d link``, ``tc -j``) and ``ethtool --json -k`` / ``ethtool -l``,
read before ADD and after DEL.  A veth reports no parent device, so DEL
finds it in the pod by MAC: the pod's MAC change is covered on igb in the
guest (tests/vm/test_restore_igb.py), not here.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from sriov_cni.node import status
from sriov_cni.paths import Paths
from sriov_cni.vfstore import FileStore
from tests.support.pluginlib import Node, altname, ip_json, link, sh

# What the pod changes, as `ip link set` arguments; each outlives a netns move.
POD_LINK_CHANGES = (
    "mtu", "1300", "promisc", "on", "allmulticast", "on", "multicast", "off", "arp", "off",
    "txqueuelen", "77", "group", "5", "alias", "the pod's",
    "gso_max_size", "32000", "gso_max_segs", "100", "gro_max_size", "32000",
)  # fmt: skip
# The `ip -j -d link` fields DEL must give back (counters, indexes and the
# operational state aside).
VIEW = (
    "ifname", "address", "mtu", "flags", "promiscuity", "allmulti", "txqlen", "group", "ifalias", "altnames",
    "gso_max_size", "gso_max_segs", "gro_max_size", "xdp",
)  # fmt: skip


def view(name: str) -> dict[str, Any]:
    entry = link(name)
    assert entry is not None, f"{name} is not in the host"
    out = {key: entry.get(key) for key in VIEW}
    out["flags"] = sorted(set(entry["flags"]) - {"LOWER_UP", "M-DOWN", "NO-CARRIER"})
    out["altnames"] = sorted(entry.get("altnames", []))
    return out


def ethtool_view(name: str, netns: str | None = None) -> dict[str, Any]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    [features] = json.loads(sh(*prefix, "ethtool", "--json", "-k", name).stdout)
    channels = sh(*prefix, "ethtool", "-l", name).stdout
    return {
        "features": {k: v["requested"] for k, v in features.items() if isinstance(v, dict) and not v["fixed"]},
        # The current counts: the part after "Current hardware settings".
        "channels": channels.split("Current")[1],
    }


def qdiscs(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(sh("tc", "-j", "qdisc", "show", "dev", name).stdout or "[]")
    return found


# --- the tests -------------------------------------------------------------------


def test_del_undoes_everything_the_pod_changed(node: Node, xdp_pass: str) -> None:
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    ns = os.path.basename(pod)
    before, eth_before, qd_before = view(vf.netdev), ethtool_view(vf.netdev), qdiscs(vf.netdev)
    conf = node.conf()
    node.add(conf, netns=pod, ifname="net1")

    # The pod, holding NET_ADMIN over its interface, changes all it can.
    sh("ip", "-n", ns, "link", "property", "add", "dev", "net1", "altname", "podname")
    sh("ip", "-n", ns, "link", "set", "dev", "net1", *POD_LINK_CHANGES)
    sh("ip", "-n", ns, "link", "set", "dev", "net1", "xdpgeneric", "pinned", xdp_pass)
    sh("ip", "netns", "exec", ns, "ethtool", "-K", "net1", "tso", "off", "rx-gro-list", "on", "tx-checksumming", "off")
    sh("ip", "netns", "exec", ns, "ethtool", "-L", "net1", "rx", "2", "tx", "2")
    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "net1", "clsact")
    changed = view_in(ns, "net1")
    # Each change took: a change the kernel ignored would make this test vacuous.
    assert changed["mtu"] == 1300 and changed["txqlen"] == 77 and changed["group"] == "5"
    assert {"PROMISC", "ALLMULTI", "NOARP"} <= set(changed["flags"]) and "MULTICAST" not in changed["flags"]
    assert changed["gso_max_size"] == 32000 and changed["gro_max_size"] == 32000 and changed["xdp"]
    assert ethtool_view("net1", ns) != eth_before

    assert node.cni("DEL", conf, netns=pod, ifname="net1").rc == 0

    assert view(vf.netdev) == before
    assert before["altnames"] == [altname(vf.netdev)]
    assert ethtool_view(vf.netdev) == eth_before
    assert qdiscs(vf.netdev) == qd_before
    assert node.records() == []


def view_in(netns: str, name: str) -> dict[str, Any]:
    entry = link(name, netns)
    assert entry is not None
    return {**entry, "flags": entry["flags"]}


def test_a_pod_that_is_gone_leaves_nothing_on_its_vf(node: Node) -> None:
    """The kernel hands the VF back when the pod's namespace goes, with all the pod did to it; DEL undoes it."""
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    ns = os.path.basename(pod)
    before, eth_before = view(vf.netdev), ethtool_view(vf.netdev)
    conf = node.conf()
    node.add(conf, netns=pod, ifname="net1")
    sh("ip", "-n", ns, "link", "property", "add", "dev", "net1", "altname", vf.netdev)
    sh("ip", "-n", ns, "link", "set", "dev", "net1", *POD_LINK_CHANGES)
    sh("ip", "netns", "exec", ns, "ethtool", "-K", "net1", "tso", "off")
    # A veth's peer goes with its namespace; a VF comes home.  Stand-in:
    # the pod's changes brought home under the pod's name, as the kernel does.
    sh("ip", "-n", ns, "link", "set", "dev", "net1", "netns", "1")
    sh("ip", "netns", "del", ns)

    assert node.cni("DEL", conf, netns=pod, ifname="net1").rc == 0

    assert view(vf.netdev) == before
    assert ethtool_view(vf.netdev) == eth_before


def test_a_stale_altname_never_blocks_the_next_pod(node: Node) -> None:
    """sriov-cni #445 of the reference plugin: the pod's altname outlived DEL, the next pod of that name failed."""
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    conf = node.conf()
    first = node.pod()
    node.add(conf, netns=first, ifname="net1")
    sh("ip", "-n", os.path.basename(first), "link", "property", "add", "dev", "net1", "altname", "podalt")
    assert node.cni("DEL", conf, netns=first, ifname="net1").rc == 0
    entry = link(vf.netdev)
    assert entry is not None and entry.get("altnames") == [altname(vf.netdev)]
    assert link("podalt") is None

    second = node.pod()
    node.add(conf, netns=second, ifname="podalt")
    inside = link("podalt", os.path.basename(second))
    assert inside is not None and inside["ifname"] == "podalt"
    assert node.cni("DEL", conf, netns=second, ifname="podalt").rc == 0


def test_a_vf_that_cannot_be_restored_keeps_its_record_and_shows_in_status(node: Node) -> None:
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    conf = node.conf()
    node.add(conf, netns=pod, ifname="net1")
    # Fixture: a record the kernel cannot meet (a veth takes no MTU above
    # 65535), as a driver refusing to take a setting back would leave it.
    store = FileStore(node.data_dir)
    [alloc] = store.all()
    assert alloc.original is not None
    alloc.original.mtu = 70000
    store.put(alloc)

    res = node.cni("DEL", conf, netns=pod, ifname="net1")

    assert res.rc != 0 and "keeps mtu: 1500 (70000)" in res.out["details"]
    [kept] = store.all()
    assert kept.unrestored == ["mtu: 1500 (70000)"]
    pfs = status.gather(Paths(sys=node.sys), node.data_dir, lambda name: link(name) is not None)
    [row] = [v for pf in pfs for v in pf["vfs"]]
    assert row["allocation"]["unrestored"] == ["mtu: 1500 (70000)"]
    assert "unrestored: mtu: 1500 (70000)" in "\n".join(status.table(pfs))


def test_a_vf_whose_name_another_device_took_comes_home_under_another_and_del_succeeds(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host device took the VF's name while the VF was in the pod (another VF's netdev, in production).

    DEL cannot give the name back: it brings the VF home under a free one,
    says so, and never takes the other device for the VF.
    """
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    conf = node.conf()
    node.add(conf, netns=pod, ifname="net1")
    sh("ip", "link", "add", vf.netdev, "type", "veth", "peer", "name", f"{vf.netdev}x", "netns", node.peer_ns)
    sh("ip", "link", "set", "dev", vf.netdev, "mtu", "1234")
    other = link(vf.netdev)
    assert other is not None

    res = node.cni("DEL", conf, netns=pod, ifname="net1")
    assert res.rc == 0, res.stdout + res.stderr
    assert "another device has taken" in capsys.readouterr().err
    assert link(vf.netdev) == other, "the other device was taken for the VF"
    homes = [
        e
        for e in ip_json("-d", "link", "show")
        if e.get("address") == f"02:5f:{node.token[:2]}:{node.token[2:4]}:00:00"
    ]
    assert len(homes) == 1 and homes[0]["ifname"] != vf.netdev, homes
    assert node.records() == []
    assert link("net1", os.path.basename(pod)) is None
