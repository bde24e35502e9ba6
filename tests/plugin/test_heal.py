"""The daemon's healing (sriov_cni.daemon.heal): a VF whose pod died without a DEL given back, address and all.

Real: the host kernel's namespaces, bind mounts and netlink moves, the
store and its claims, host-local and sriov-ipam.  Fixtures: the PF side
(FakeVfControl), veths as VF netdevs, and the kernel's return of a
physical netdev from a dead namespace: a veth dies with its namespace, so
each test moves the VF's veth home first, as the kernel moves a real VF's
netdev when the namespace ends.  tests/vm/test_heal_igb.py shows the real
driver and the daemon's event-driven sweeps.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.daemon.heal import Healer
from sriov_cni.kernel import netns
from sriov_cni.vfstore import FileStore
from tests.plugin.delgc import ok
from tests.support.daemonlib import wait_for
from tests.support.pluginlib import DEBIAN_CNI_DIR, Node, ipam_reservations, link, sh

IPAMS = ["host-local", "sriov-ipam"]


def _healer(node: Node) -> Healer:
    return Healer(node.data_dir, node.deps(), {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, None)


def _ipam(node: Node, kind: str) -> dict[str, Any]:
    return node.host_local() if kind == "host-local" else node.sriov_ipam()


def _refund(node: Node, ns_path: str, ifname: str = "net1") -> None:
    """What the kernel does with a physical netdev when its namespace ends: back to the host's (fixture).

    The VF's sysfs entry then names it as it is called in the host.
    """
    sh("nsenter", f"--net={ns_path}", "ip", "link", "set", ifname, "netns", str(os.getpid()))
    node.sysfs_rename(node.pfs[0].vfs[0], ifname)


def _links_in(ns_path: str) -> list[str]:
    out = sh("nsenter", f"--net={ns_path}", "ip", "-j", "link", "show").stdout
    return [entry["ifname"] for entry in json.loads(out)]


def _pod_dies(node: Node, pod: str) -> None:
    """The pod's namespace ends without a DEL: its VF comes home, its runtime's path goes."""
    _refund(node, pod)
    sh("ip", "netns", "del", os.path.basename(pod))
    node.pods.remove(pod)


def _without_pods(picture: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in picture.items() if k != "pods"}


@pytest.mark.parametrize("ipam", IPAMS)
def test_a_vf_whose_pod_died_without_del_is_given_back_with_its_address(node: Node, ipam: str) -> None:
    pf = node.add_pf(1)
    clean = node.picture()
    conf = node.conf(vlan=100, mac="02:00:00:aa:bb:01", ipam=_ipam(node, ipam))
    pod = node.pod()
    node.add(conf, netns=pod, container="dead", args="IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=gone-0")
    assert node.fake.state[pf.name][0]["vlan"] == 100
    assert len(ipam_reservations(node.ipam_dir, "sriov-net")) == 1
    _pod_dies(node, pod)
    # The VF came home carrying the pod's name and MAC.
    assert link("net1") is not None

    _healer(node).sweep()

    assert _without_pods(node.picture()) == _without_pods(clean)
    assert link("net1") is None
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()
    # The next pod gets the VF (its sysfs entry names it as restored).
    node.sysfs_rename(pf.vfs[0], str(pf.vfs[0].netdev))
    node.add(conf, netns=node.pod(), container="next")
    assert [(a.vf_pci, a.container_id) for a in FileStore(node.data_dir).all()] == [(pf.vfs[0].pci, "next")]


def test_nothing_is_given_back_while_a_bind_mount_keeps_the_namespace(node: Node, tmp_path: Path) -> None:
    node.add_pf(1)
    clean = node.picture()
    conf = node.conf(vlan=7, ipam=node.host_local())
    pod = node.pod()
    node.add(conf, netns=pod, container="held")
    hold = tmp_path / "hold"
    hold.touch()
    sh("mount", "--bind", pod, str(hold))
    try:
        # The runtime removed its path; the namespace lives on through the mount.
        sh("ip", "netns", "del", os.path.basename(pod))
        node.pods.remove(pod)
        [record] = FileStore(node.data_dir).all()
        assert netns.netns_inode(record.netns) is None
        _healer(node).sweep()
        assert [a.container_id for a in FileStore(node.data_dir).all()] == ["held"]
        assert "net1" in _links_in(str(hold))
        assert len(ipam_reservations(node.ipam_dir, "sriov-net")) == 1
        _refund(node, str(hold))
    finally:
        sh("umount", str(hold))

    _healer(node).sweep()

    assert _without_pods(node.picture()) == _without_pods(clean)
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_a_record_of_an_earlier_boot_is_given_back(node: Node) -> None:
    node.add_pf(2)
    clean = node.picture()
    conf = node.conf(vlan=9, ipam=node.sriov_ipam())
    pods = [node.pod(), node.pod()]
    for i, pod in enumerate(pods):
        node.add(conf, netns=pod, container=f"before-reboot-{i}")
    store = FileStore(node.data_dir)
    # What a node rebooted with pods on it finds: records of another boot.
    # (Their namespaces still exist here, which a reboot would have ended.)
    for alloc in store.all():
        alloc.boot_id = "an earlier boot"
        store.put(alloc)

    _healer(node).sweep()

    assert store.all() == []
    assert _without_pods(node.picture()) == _without_pods(clean)
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_a_live_pod_keeps_its_vf(node: Node) -> None:
    node.add_pf(1)
    conf = node.conf(vlan=3, ipam=node.host_local())
    pod = node.pod()
    node.add(conf, netns=pod, container="alive")
    before = node.picture()
    _healer(node).sweep()
    assert node.picture() == before


def test_a_vf_another_call_holds_is_left_to_it_and_a_late_del_finds_nothing(node: Node) -> None:
    node.add_pf(1)
    clean = node.picture()
    conf = node.conf(vlan=11, ipam=node.host_local())
    pod = node.pod()
    node.add(conf, netns=pod, container="racing")
    vf = node.pfs[0].vfs[0].pci
    _pod_dies(node, pod)
    store = FileStore(node.data_dir)
    claim = store.claim(vf)
    assert claim is not None
    with claim:
        # A DEL or an ADD holds the VF: it deals with it.
        _healer(node).sweep()
        assert [a.container_id for a in store.all()] == ["racing"]
    _healer(node).sweep()
    assert store.all() == []
    # The runtime's DEL, arriving after all: nothing left to do, no error.
    ok(node.cni("DEL", conf, netns=pod, container="racing"))
    assert _without_pods(node.picture()) == _without_pods(clean)


def test_a_stale_vf_reclaimed_by_an_add_of_another_network_frees_the_dead_pods_address(node: Node) -> None:
    # Without a daemon, an ADD that finds no free VF reclaims a stale one;
    # the dead pod's address is released through its own network's IPAM.
    node.add_pf(1)
    first = node.conf(name="net-a", ipam=node.host_local())
    pod = node.pod()
    node.add(first, netns=pod, container="dead")
    assert len(ipam_reservations(node.ipam_dir, "net-a")) == 1
    _pod_dies(node, pod)
    second = node.conf(name="net-b", ipam=node.host_local(subnet="10.42.0.0/24"))
    res = node.add(second, netns=node.pod(), container="new")
    assert res.out["ips"][0]["address"].startswith("10.42.0.")
    assert ipam_reservations(node.ipam_dir, "net-a") == set()


def test_an_ipam_section_too_large_for_a_record_is_refused_before_anything_is_taken(node: Node) -> None:
    node.add_pf(1)
    before = node.picture()
    routes = [{"dst": f"10.{i // 256}.{i % 256}.0/24"} for i in range(1000)]
    res = node.cni("ADD", node.conf(ipam=node.host_local(routes=routes)), netns=node.pod(), container="big")
    assert res.rc != 0 and res.code == 7 and "ipam section" in res.out["msg"], res.stdout
    assert _without_pods(node.picture()) == _without_pods(before)


SLOW_IPAM = """#!/bin/sh
# host-local, whose DEL waits while {slow} exists (after saying it started).
if [ "$CNI_COMMAND" = DEL ] && [ -e {slow} ]; then
    touch {started}
    while [ -e {slow} ]; do sleep 0.05; done
fi
exec {host_local}
"""


def test_a_del_killed_before_its_address_was_released_leaves_the_record_for_the_healing(
    node: Node, tmp_path: Path
) -> None:
    node.add_pf(1)
    clean = node.picture()
    bin_dir, slow, started = tmp_path / "bin", tmp_path / "slow", tmp_path / "started"
    bin_dir.mkdir()
    wrapper = bin_dir / "slow-ipam"
    wrapper.write_text(SLOW_IPAM.format(slow=slow, started=started, host_local=f"{DEBIAN_CNI_DIR}/host-local"))
    wrapper.chmod(0o755)
    conf = node.conf(vlan=12, ipam=dict(node.host_local(), type="slow-ipam"))
    path = f"{bin_dir}:{DEBIAN_CNI_DIR}"
    pod = node.pod()
    node.add(conf, netns=pod, container="killed", path=path)
    slow.touch()
    # The runtime's DEL, killed (with the IPAM plugin it runs) while the address is being released.
    child = multiprocessing.get_context("fork").Process(
        target=node.cni, args=("DEL", conf), kwargs={"netns": pod, "container": "killed", "path": path}
    )
    child.start()
    wait_for(started.exists)
    os.kill(child.pid or 0, signal.SIGKILL)
    child.join(30)
    # The VF is back; its record stays until the address is released.
    assert link(str(node.pfs[0].vfs[0].netdev)) is not None
    assert [a.container_id for a in FileStore(node.data_dir).all()] == ["killed"]
    assert len(ipam_reservations(node.ipam_dir, "sriov-net")) == 1
    slow.unlink()
    # No DEL comes again: the pod's namespace goes.
    sh("ip", "netns", "del", os.path.basename(pod))
    node.pods.remove(pod)

    _healer(node).sweep()

    assert _without_pods(node.picture()) == _without_pods(clean)
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


FAILING_IPAM = """#!/bin/sh
# host-local, whose DEL fails while {failing} exists.
if [ "$CNI_COMMAND" = DEL ] && [ -e {failing} ]; then
    echo '{{"cniVersion": "1.0.0", "code": 11, "msg": "store unreachable"}}'
    exit 1
fi
exec {host_local}
"""


def test_a_release_that_fails_keeps_the_record_until_it_succeeds(node: Node, tmp_path: Path) -> None:
    node.add_pf(1)
    clean = node.picture()
    bin_dir, failing = tmp_path / "bin", tmp_path / "failing"
    bin_dir.mkdir()
    wrapper = bin_dir / "failing-ipam"
    wrapper.write_text(FAILING_IPAM.format(failing=failing, host_local=f"{DEBIAN_CNI_DIR}/host-local"))
    wrapper.chmod(0o755)
    conf = node.conf(vlan=13, ipam=dict(node.host_local(), type="failing-ipam"))
    pod = node.pod()
    node.add(conf, netns=pod, container="lost", path=f"{bin_dir}:{DEBIAN_CNI_DIR}")
    _pod_dies(node, pod)
    failing.touch()

    assert _healer(node).sweep()  # failed

    [kept] = FileStore(node.data_dir).all()
    assert (kept.container_id, kept.giving_back) == ("lost", "netns gone")
    assert len(ipam_reservations(node.ipam_dir, "sriov-net")) == 1
    failing.unlink()
    node.sysfs_rename(node.pfs[0].vfs[0], str(node.pfs[0].vfs[0].netdev))

    assert not _healer(node).sweep()

    assert _without_pods(node.picture()) == _without_pods(clean)
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()
