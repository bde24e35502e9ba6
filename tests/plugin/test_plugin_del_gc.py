"""DEL's idempotence, stale allocations, GC, CHECK, STATUS and pool exhaustion."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import threading
from typing import Any

import pytest

from sriov_cni.kernel.vfsettings import Vlan
from sriov_cni.vfstore import FileStore
from tests.plugin.delgc import ok, stale_record
from tests.support.pluginlib import DEBIAN_CNI_DIR, VF, Node, ipam_reservations, link, link_names, netdev_view, sh

# --- DEL ----------------------------------------------------------------------


def test_del_twice(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(vlan=5)
    node.add(conf, netns=pod)
    ok(node.cni("DEL", conf, netns=pod))
    ok(node.cni("DEL", conf, netns=pod))
    assert node.picture() == before


def test_del_without_add(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    ok(node.cni("DEL", node.conf(ipam=node.sriov_ipam()), netns=pod))
    ok(node.cni("DEL", node.conf(), netns=""))
    assert node.picture() == before
    assert node.fake.calls == []


def test_del_with_empty_netns_still_gives_the_vf_back(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(trust="on")
    node.add(conf, netns=pod)
    ok(node.cni("DEL", conf, netns=""))
    assert node.picture() == before


def test_del_with_a_config_add_would_reject(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    node.add(node.conf(vlan=5), netns=pod)
    # The operator broke the NetworkAttachmentDefinition meanwhile.
    broken = node.conf(vlan=5000, mac="nonsense", pfNames="nonsense")
    ok(node.cni("DEL", broken, netns=pod))
    assert node.picture() == before


def _vf_in_a_pod(node: Node) -> tuple[VF, str, dict[str, Any], dict[str, Any]]:
    """A VF added to a new pod as net1, renamed there to a name unique to this run, down.

    Returns the VF, the pod, the node's picture before the ADD and the config.
    """
    vf = node.add_pf(1).vfs[0]
    pod = node.pod()
    before = node.picture()
    conf = node.conf(spoofchk="off")
    node.add(conf, netns=pod)
    # Unique: the host has its own net1-like names.
    sh("ip", "-n", os.path.basename(pod), "link", "set", "net1", "down", "name", f"sv{node.token}r")
    return vf, pod, before, conf


def _kernel_brings_it_home(node: Node, vf: VF, netns: str) -> None:
    # As the kernel does with a physical netdev whose namespace goes away:
    # back in the host under its pod-side name, and sysfs lists that name.
    sh("ip", "-n", netns, "link", "set", f"sv{node.token}r", "netns", "1")
    node.sysfs_rename(vf, f"sv{node.token}r")


def test_del_after_the_vf_came_back_to_the_host(node: Node) -> None:
    vf, pod, before, conf = _vf_in_a_pod(node)
    _kernel_brings_it_home(node, vf, os.path.basename(pod))

    ok(node.cni("DEL", conf, netns=pod))

    node.sysfs_rename(vf, str(vf.netdev))
    assert node.picture() == before


def test_a_refused_move_home_leaves_a_host_link_of_the_pod_side_name_alone(node: Node) -> None:
    # The VF cannot go home under its name (the host has taken it), and the
    # host has a link of its own named as the VF is in the pod.  That link
    # is not ours to move into the pod while undoing the refused move, nor
    # to take for the VF: the VF comes home under a free name.
    pf = node.add_pf(1)
    vf = pf.vfs[0]
    pod = node.pod()
    ifname = f"sv{node.token}i"
    conf = node.conf()
    node.add(conf, netns=pod, ifname=ifname)
    squatter, bystander = str(vf.netdev), ifname
    for name in (squatter, bystander):
        sh("ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p", "netns", node.peer_ns)
    theirs = {name: link(name) for name in (squatter, bystander)}
    try:
        ok(node.cni("DEL", conf, netns=pod, ifname=ifname))
        assert {name: link(name) for name in theirs} == theirs
        assert link_names(os.path.basename(pod)) == {"lo"}
        [home] = [n for n in link_names() if n.startswith("sriovvf")]
        assert (link(home) or {}).get("address") == f"02:5f:{node.token[:2]}:{node.token[2:4]}:00:00"
        assert node.records() == []
    finally:
        for name in (squatter, bystander):
            sh("ip", "link", "del", name, check=False)


def test_del_waits_for_the_vf_to_come_back_from_a_namespace_being_destroyed(node: Node) -> None:
    # The pod's namespace file is gone, but the kernel has not yet handed
    # the VF's netdev back (its cleanup of the namespace runs later): the VF
    # is in neither namespace.  DEL must wait for it, not drop the record
    # and leave the VF to come back with the pod's name and settings.
    vf, pod, before, conf = _vf_in_a_pod(node)
    limbo = f"svlimbo-{node.token}"
    sh("ip", "netns", "add", limbo)
    try:
        ns = os.path.basename(pod)
        sh("ip", "-n", ns, "link", "set", f"sv{node.token}r", "netns", limbo)
        sh("ip", "netns", "del", ns)
        node.pods.remove(pod)
        del before["pods"][pod]
        home = threading.Timer(1.0, _kernel_brings_it_home, (node, vf, limbo))
        home.start()
        try:
            ok(node.cni("DEL", conf, netns=pod))
        finally:
            home.join()
    finally:
        sh("ip", "netns", "del", limbo, check=False)
    node.sysfs_rename(vf, str(vf.netdev))
    assert node.picture() == before


# --- stale allocations -----------------------------------------------------------


def test_stale_allocation_is_reclaimed_by_add(node: Node) -> None:
    pf = node.add_pf(1)
    clean = node.picture()
    stale_record(node, vlan=Vlan(42, 0, 0x8100))
    node.fake.state[pf.name][0]["vlan"] = 42  # what the dead container left behind
    pod = node.pod()

    res = node.add(node.conf("1.1.0"), netns=pod, container="new")

    assert res.out["interfaces"][0]["pciID"] == pf.vfs[0].pci
    # Put back first, then handed out.
    assert node.fake.calls == [("vlan", pf.name, 0, (0, 0, 0x8100))]
    [record] = FileStore(node.data_dir).all()
    assert record.container_id == "new"
    ok(node.cni("DEL", node.conf("1.1.0"), netns=pod, container="new"))
    assert {k: v for k, v in node.picture().items() if k != "pods"} == {k: v for k, v in clean.items() if k != "pods"}


def test_add_reclaiming_a_stale_vf_gets_the_last_address_of_the_range(node: Node) -> None:
    # IPAM starts before the VF is chosen; only reclaiming the dead
    # container's VF frees the one address of this range, so the ADD must
    # ask IPAM again after the reclaim.
    node.add_pf(1)
    one_address = [[{"subnet": "10.41.0.0/24", "rangeStart": "10.41.0.9", "rangeEnd": "10.41.0.9"}]]
    conf = node.conf(ipam=node.host_local(ranges=one_address))
    stale_record(node, ipam_config={key: conf[key] for key in ("cniVersion", "name", "type", "ipam")})
    held = subprocess.run(
        [f"{DEBIAN_CNI_DIR}/host-local"],
        input=json.dumps(conf),
        capture_output=True,
        text=True,
        check=True,
        env=node.env("ADD", container="dead", netns="/var/run/netns/svpod-long-gone"),
    )
    assert json.loads(held.stdout)["ips"][0]["address"] == "10.41.0.9/24"
    pod = node.pod()

    res = node.add(conf, netns=pod, container="new")

    assert res.out["ips"][0]["address"] == "10.41.0.9/24"
    [record] = FileStore(node.data_dir).all()
    assert record.container_id == "new"
    ok(node.cni("DEL", conf, netns=pod, container="new"))
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_stale_allocation_is_reclaimed_by_gc(node: Node) -> None:
    pf = node.add_pf(1)
    clean = node.picture()
    stale_record(node, trust=True)
    node.fake.state[pf.name][0]["trust"] = True
    ok(node.cni("GC", dict(node.conf("1.1.0"), **{"cni.dev/valid-attachments": []})))
    assert node.picture() == clean


def test_live_allocation_is_never_reclaimed(node: Node) -> None:
    node.add_pf(1)
    node.add(node.conf(), netns=node.pod(), container="alive")
    before = node.picture()
    res = node.cni("ADD", node.conf(), netns=node.pod(), container="other")
    assert res.rc != 0 and res.code == 101
    assert node.picture() == {**before, "pods": node.picture()["pods"]}
    [record] = FileStore(node.data_dir).all()
    assert record.container_id == "alive"


# --- pool exhaustion and STATUS ------------------------------------------------------


def test_exhausted_pool_fails_101_and_status_50(node: Node) -> None:
    node.add_pf(3)
    conf = node.conf("1.1.0")
    ok(node.cni("STATUS", conf))
    for i in range(3):
        node.add(conf, netns=node.pod(), container=f"c{i}")
    before = node.picture()

    res = node.cni("ADD", conf, netns=node.pod(), container="c3")

    assert res.rc != 0 and res.code == 101
    assert "no free VF" in res.out["msg"] and "3 VFs" in res.out["msg"]
    status = node.cni("STATUS", conf)
    assert status.rc != 0 and status.code == 50
    assert "no free VF" in status.out["msg"]
    assert {k: v for k, v in node.picture().items() if k != "pods"} == {k: v for k, v in before.items() if k != "pods"}

    ok(node.cni("DEL", conf, netns=node.pods[1], container="c1"))
    ok(node.cni("STATUS", conf))


def test_status_of_a_pool_with_an_unknown_pf_fails_50(node: Node) -> None:
    node.add_pf(1)
    res = node.cni("STATUS", node.conf("1.1.0", pfNames=["nosuchpf9"]))
    assert res.rc != 0 and res.code == 50
    assert "nosuchpf9" in res.stdout


# --- concurrency -------------------------------------------------------------------


def _child_add(node: Node, container: str, pod: str, queue: Any) -> None:
    res = node.cni("ADD", node.conf("1.1.0"), netns=pod, container=container)
    queue.put((container, res.rc, res.stdout))


def test_parallel_adds_get_distinct_vfs(node: Node) -> None:
    pf = node.add_pf(6)
    pods = [node.pod() for _ in range(6)]
    # Separate processes (fork: each child has the fake), one ADD each, at once.
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child_add, args=(node, f"par{i}", pods[i], queue)) for i in range(6)]
    for child in children:
        child.start()
    results = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(60)
        assert child.exitcode == 0

    assert all(rc == 0 for _, rc, _ in results), results
    taken = {c: json.loads(out)["interfaces"][0]["pciID"] for c, _, out in results}
    assert sorted(taken.values()) == sorted(vf.pci for vf in pf.vfs)
    records = FileStore(node.data_dir).all()
    assert sorted((r.container_id, r.vf_pci) for r in records) == sorted(taken.items())
    assert not set(node.vf_netdevs()) & link_names()
    for pod in pods:
        assert link_names(os.path.basename(pod)) == {"lo", "net1"}


# --- GC ---------------------------------------------------------------------------


def test_gc_releases_what_is_not_listed(node: Node) -> None:
    pf = node.add_pf(4)
    clean = node.picture()
    net_a = node.conf("1.1.0", name="net-a", vlan=11)
    net_b = node.conf("1.1.0", name="net-b", vlan=12)
    keep, drop, legacy_keep = node.pod(), node.pod(), node.pod()
    node.add(net_a, netns=keep, container="keep")
    node.add(net_a, netns=drop, container="drop")
    node.add(net_b, netns=node.pod(), container="other-net")

    gc = dict(net_a, **{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "net1"}]})
    ok(node.cni("GC", gc))

    owners = {r.container_id: r.network for r in FileStore(node.data_dir).all()}
    assert owners == {"keep": "net-a", "other-net": "net-b"}
    assert link_names(os.path.basename(drop)) == {"lo"}
    assert link_names(os.path.basename(keep)) == {"lo", "net1"}
    dropped = pf.vfs[1]
    dropped_link = link(str(dropped.netdev))
    assert dropped_link is not None
    assert netdev_view(dropped_link) == clean["host"][dropped.netdev]
    assert node.fake.state[pf.name][1] == clean["fake"][pf.name][1]

    # The older key name, and an attachment for another ifname is not ours.
    node.add(net_a, netns=legacy_keep, container="legacy")
    gc = dict(
        net_a,
        **{
            "cni.dev/attachments": [
                {"containerID": "legacy", "ifname": "net1"},
                {"containerID": "keep", "ifname": "eth9"},
            ]
        },
    )
    ok(node.cni("GC", gc))
    owners = {r.container_id: r.network for r in FileStore(node.data_dir).all()}
    assert owners == {"legacy": "net-a", "other-net": "net-b"}


MALFORMED_ATTACHMENTS: dict[str, object] = {
    "null": None,
    "false": False,
    "0": 0,
    "empty string": "",
    "empty object": {},
    "entry without ifname": [{"containerID": "keep"}],
    "entry with empty ifname": [{"containerID": "keep", "ifname": ""}],
    "entry without containerID": [{"ifname": "net1"}],
}


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
@pytest.mark.parametrize("value", list(MALFORMED_ATTACHMENTS.values()), ids=list(MALFORMED_ATTACHMENTS))
def test_gc_with_a_malformed_list_releases_nothing(node: Node, key: str, value: Any) -> None:
    node.add_pf(2)
    conf = node.conf("1.1.0", ipam=node.sriov_ipam("10.47.0.0/24"))
    pods = [node.pod(), node.pod()]
    for cid, pod in zip(("keep", "other"), pods, strict=True):
        node.add(conf, netns=pod, container=cid)
    before = node.picture()
    reserved = ipam_reservations(node.ipam_dir, "sriov-net")
    assert len(reserved) == 2

    res = node.cni("GC", dict(conf, **{key: value}))

    assert res.rc != 0 and res.code == 7, res.stdout
    assert res.out["msg"].startswith(key)
    assert "released nothing" in res.out["details"]
    # Neither the VFs nor (in-process sriov-ipam) the addresses were touched.
    assert node.picture() == before
    assert all(link_names(os.path.basename(pod)) == {"lo", "net1"} for pod in pods)
    assert ipam_reservations(node.ipam_dir, "sriov-net") == reserved


# --- CHECK ------------------------------------------------------------------------


def _added(node: Node, version: str = "1.1.0", driver: str = "fakepf") -> tuple[dict[str, Any], str, dict[str, Any]]:
    node.add_pf(1, driver=driver)
    pod = node.pod()
    conf = node.conf(version, vlan=9, ipam=node.sriov_ipam("10.46.0.0/24", gateway="10.46.0.1"))
    res = node.add(conf, netns=pod)
    return conf, pod, dict(conf, prevResult=res.out)


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0", "1.1.0"])
def test_check_passes_right_after_add(node: Node, version: str) -> None:
    conf, pod, with_prev = _added(node, version)
    ok(node.cni("CHECK", with_prev, netns=pod))
    ok(node.cni("DEL", conf, netns=pod))
    # Nothing recorded any more: CHECK has nothing to vouch for.
    res = node.cni("CHECK", with_prev, netns=pod)
    assert res.rc != 0 and res.code == 100


def test_check_needs_prev_result(node: Node) -> None:
    conf, pod, _ = _added(node)
    res = node.cni("CHECK", conf, netns=pod)
    assert res.rc != 0 and res.code == 7
    assert "prevResult" in res.out["msg"]


@pytest.mark.parametrize(
    "change, named",
    [
        (("link", "set", "net1", "address", "02:de:ad:00:00:01"), "MAC"),
        (("link", "set", "net1", "mtu", "1280"), "MTU"),
        (("addr", "flush", "dev", "net1"), "10.46.0.2/24"),
    ],
    ids=["mac", "mtu", "address"],
)
def test_check_fails_when_the_pod_interface_changed(node: Node, change: tuple[str, ...], named: str) -> None:
    _conf, pod, with_prev = _added(node)
    ok(node.cni("CHECK", with_prev, netns=pod))
    sh("ip", "-n", os.path.basename(pod), *change)
    res = node.cni("CHECK", with_prev, netns=pod)
    assert res.rc != 0 and res.code == 100
    assert named in res.out["details"]


def test_check_finds_each_route_by_destination_and_gateway(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    ipam = node.sriov_ipam("10.46.0.0/24", gateway="10.46.0.1")
    ipam["routes"] = [{"dst": f"10.{50 + i}.0.0/16"} for i in range(20)] + [{"dst": "10.90.0.0/16", "gw": "10.46.0.9"}]
    conf = node.conf("1.1.0", ipam=ipam)
    with_prev = dict(conf, prevResult=node.add(conf, netns=pod).out)
    ok(node.cni("CHECK", with_prev, netns=pod))
    netns = os.path.basename(pod)
    sh("ip", "-n", netns, "route", "del", "10.69.0.0/16")
    sh("ip", "-n", netns, "route", "replace", "10.90.0.0/16", "via", "10.46.0.8", "dev", "net1")
    res = node.cni("CHECK", with_prev, netns=pod)
    assert res.rc != 0 and res.code == 100
    assert res.out["details"] == (
        "route 10.69.0.0/16 via link is missing; route 10.90.0.0/16 via 10.46.0.9 is missing"
    ), res.out


def test_check_fails_when_the_pf_side_vlan_changed(node: Node) -> None:
    _conf, pod, with_prev = _added(node)
    node.fake.state[node.pfs[0].name][0]["vlan"] = 10
    res = node.cni("CHECK", with_prev, netns=pod)
    assert res.rc != 0 and res.code == 100
    assert "vlan" in res.out["details"]


def test_check_fails_when_the_pf_holds_another_mac_for_the_vf(node: Node) -> None:
    """No ``mac`` configured: whatever the PF driver, a MAC it holds for the VF must be the pod's."""
    _conf, pod, with_prev = _added(node)
    node.fake.state[node.pfs[0].name][0]["mac"] = "02:de:ad:00:00:02"
    res = node.cni("CHECK", with_prev, netns=pod)
    assert res.rc != 0 and res.code == 100
    assert "02:de:ad:00:00:02" in res.out["details"] and "does not receive" in res.out["details"]


@pytest.mark.parametrize("driver, zero_passes", [("fakepf", True), ("igb", False), ("ixgbe", False)])
def test_check_of_a_zero_pf_reading_depends_on_the_pf_driver(node: Node, driver: str, zero_passes: bool) -> None:
    """igb and ixgbe report the MAC the VF programmed: zero there, with carrier, means the VF receives nothing."""
    _conf, pod, with_prev = _added(node, driver=driver)
    pf = node.pfs[0].name
    assert node.fake.state[pf][0]["mac"] == "00:00:00:00:00:00"
    # No carrier yet (the veth's peer is down): a new igbvf VF is in this
    # state until its first reset programs its MAC.
    ok(node.cni("CHECK", with_prev, netns=pod))
    sh("ip", "-n", node.peer_ns, "link", "set", "peer00", "up")
    [inside] = json.loads(sh("ip", "-j", "-n", os.path.basename(pod), "link", "show", "dev", "net1").stdout)
    assert "LOWER_UP" in inside["flags"]
    res = node.cni("CHECK", with_prev, netns=pod)
    assert (res.rc == 0) is zero_passes, res.stdout
    if not zero_passes:
        assert res.code == 100 and "00:00:00:00:00:00" in res.out["details"]
    # The VF programmed the pod interface's MAC, as igbvf does at ADD.
    node.fake.state[pf][0]["mac"] = inside["address"]
    ok(node.cni("CHECK", with_prev, netns=pod))
