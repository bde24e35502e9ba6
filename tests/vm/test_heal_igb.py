"""Pods that die without a DEL: the daemon gives their VFs back on the real igb/igbvf driver (the rig's QEMU guest).

Real: Debian 12's kernel, igb and igbvf, the kernel bringing a dead
namespace's VF netdev home and announcing it, the daemon and its healing
process, the static shim as the runtime's ``sriov``, host-local and
sriov-ipam.  The runtime is stood in for by the test: it calls the shim,
and loses a pod by removing its namespace (``ip netns del``) without a DEL,
as a runtime killed mid-teardown or a removed sandbox leaves it.  Traffic
is the oracle for the next pods on the same VFs.
"""

from __future__ import annotations

import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sriov_cni.vfstore import FileStore
from tests.support.pluginlib import ipam_reservations
from tests.vm.plugincalls import host_link, ns_path, ping, vfinfo, view
from tests.vm.shimnode import ShimNode
from tests.vm.vmlib import Sriov, wait_until

pytestmark = pytest.mark.sriov_vm

# Seconds a give-back may take before the test fails: far above what it
# takes (the closing figures print the times), only a hang reaches it.
BOUND = 120.0
# One subnet, a range each: the two networks' pods reach each other.
RANGES = {
    "host-local": {"subnet": "10.83.0.0/24", "rangeStart": "10.83.0.2", "rangeEnd": "10.83.0.99"},
    "sriov-ipam": {"subnet": "10.83.0.0/24", "rangeStart": "10.83.0.100", "rangeEnd": "10.83.0.199"},
}


class Node(ShimNode):
    """The shim and the daemon over the test's store, on one PF, with two networks (host-local, sriov-ipam)."""

    def __init__(self, work: Path, pf: str) -> None:
        super().__init__(work)
        self.pf = pf

    def conf(self, ipam: str, vlan: int, mac: str) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": f"heal-{ipam}",
            "type": "sriov",
            "pfNames": [self.pf],
            "dataDir": str(self.state),
            "vlan": vlan,
            "mac": mac,
            "spoofchk": "on",
            "trust": "on",
            "ipam": {"type": ipam, "dataDir": str(self.work / "ipam"), "ranges": [[RANGES[ipam]]]},
        }

    def add_or_del(self, command: str, conf: dict[str, Any], container: str, pod: str) -> dict[str, Any]:
        return self.call(command, conf, container, pod, self.args(container))

    @staticmethod
    def args(container: str) -> str:
        return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=heal;K8S_POD_NAME={container}"

    def given_back(self) -> dict[tuple[str, str], float]:
        return {
            (s.labels["reason"], s.labels["result"]): s.value
            for family in text_string_to_metric_families(self.scrape())
            for s in family.samples
            if s.name == "sriov_cni_vfs_given_back_total"
        }

    def reservations(self) -> set[str]:
        return set().union(*(ipam_reservations(self.work / "ipam", f"heal-{ipam}") for ipam in RANGES))


@pytest.fixture
def node(igb_pfs: list[str], tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, igb_pfs[0])
    yield n
    n.close()


def _gone_within_bound(node: Node, containers: set[str]) -> float:
    """Seconds until none of ``containers`` has a record left (polled: the healing is another process's)."""
    started = time.monotonic()
    wait_until(lambda: not containers & set(node.records()), BOUND, f"the VFs of {sorted(containers)} given back")
    return time.monotonic() - started


def _pair(node: Node, tag: str, ipams: tuple[str, str] = ("host-local", "sriov-ipam")) -> list[tuple[str, str, str]]:
    """Two pods on one VLAN that ping each other both ways: (container, namespace, address) each."""
    pods = []
    for i, ipam in enumerate(ipams):
        pod = node.pod("heal")
        res = node.add_or_del("ADD", node.conf(ipam, 100, f"02:4e:a1:00:00:{i + 1:02x}"), f"{tag}{i}", pod)
        pods.append((f"{tag}{i}", pod, res["ips"][0]["address"].split("/")[0]))
    ping(pods[0][1], pods[1][2])
    ping(pods[1][1], pods[0][2])
    return pods


def test_vfs_whose_pods_died_without_del_are_given_back_and_serve_the_next_pods(
    node: Node, sriov: Sriov, capsys: pytest.CaptureFixture[str]
) -> None:
    vf_names = sriov.enable(node.pf, 2)
    before = [vfinfo(node.pf, i) for i in range(2)]
    netdevs_before = [view(host_link(name)) for name in vf_names]
    node.start()
    times = []
    # The VFs' first use, then their reuse by pods whose predecessors died.
    for round_ in range(3):
        pods = _pair(node, f"r{round_}p")
        assert len(node.reservations()) == 2
        for _, pod, _ in pods:
            subprocess.run(["ip", "netns", "del", pod], check=True)
        times.append(_gone_within_bound(node, {c for c, _, _ in pods}))
        assert [vfinfo(node.pf, i) for i in range(2)] == before
        assert [view(host_link(name)) for name in vf_names] == netdevs_before
        assert node.reservations() == set()
    assert node.given_back() == {("netns gone", "given_back"): 6.0}
    with capsys.disabled():
        sys.stdout.write(
            f"\nheal: namespace deleted to both VFs given back: {', '.join(f'{t:.2f}' for t in times)} s "
            f"(median {statistics.median(times):.2f} s)\n"
        )


def test_a_namespace_a_bind_mount_keeps_alive_keeps_its_vf_until_the_mount_goes(
    node: Node, sriov: Sriov, tmp_path: Path
) -> None:
    vf_names = sriov.enable(node.pf, 2)
    before = [vfinfo(node.pf, i) for i in range(2)]
    node.start()
    (kept, kept_ns, _), (other, other_ns, _) = _pair(node, "bind")
    hold = tmp_path / "hold"
    hold.touch()
    subprocess.run(["mount", "--bind", ns_path(kept_ns), str(hold)], check=True)
    try:
        subprocess.run(["ip", "netns", "del", kept_ns], check=True)
        # The other pod's death makes the healing sweep after the kept
        # one's path went: once that VF is back, the sweep has passed it.
        subprocess.run(["ip", "netns", "del", other_ns], check=True)
        _gone_within_bound(node, {other})
        assert node.records() == [kept]
        inside = subprocess.run(
            ["nsenter", f"--net={hold}", "ip", "-j", "link", "show", "net1"], capture_output=True, text=True, check=True
        )
        assert json.loads(inside.stdout)[0]["address"] == "02:4e:a1:00:00:01"
        assert len(node.reservations()) == 1
    finally:
        subprocess.run(["umount", str(hold)], check=True)
    _gone_within_bound(node, {kept})
    assert [vfinfo(node.pf, i) for i in range(2)] == before
    assert all(host_link(name) is not None for name in vf_names)
    assert node.reservations() == set()


def test_records_of_an_earlier_boot_are_given_back_when_the_daemon_starts(node: Node, sriov: Sriov) -> None:
    sriov.enable(node.pf, 2)
    before = [vfinfo(node.pf, i) for i in range(2)]
    node.start()
    pods = _pair(node, "boot")
    node.stop()
    # What a node rebooted with pods on it finds: the pods' namespaces
    # ended (their VFs home, as the driver would recreate them), and
    # records of another boot.
    store = FileStore(node.state)
    for alloc in store.all():
        alloc.boot_id = "an earlier boot"
        store.put(alloc)
    for _, pod, _ in pods:
        subprocess.run(["ip", "netns", "del", pod], check=True)
    assert len(node.records()) == 2
    node.start()
    _gone_within_bound(node, {c for c, _, _ in pods})
    assert [vfinfo(node.pf, i) for i in range(2)] == before
    assert node.reservations() == set()
    assert node.given_back() == {("earlier boot", "given_back"): 2.0}
    # And the VFs serve again.
    again = _pair(node, "after")
    for container, pod, _ in again:
        conf = node.conf("host-local" if container.endswith("0") else "sriov-ipam", 100, "02:4e:a1:00:00:09")
        node.add_or_del("DEL", conf, container, pod)
    assert node.records() == []


def test_a_del_killed_before_the_address_was_released_is_finished_once_the_pod_is_gone(
    node: Node, sriov: Sriov
) -> None:
    vf_names = sriov.enable(node.pf, 1)
    before, netdev_before = vfinfo(node.pf, 0), view(host_link(vf_names[0]))
    node.start()
    daemon = node.daemon
    assert daemon is not None
    pod = node.pod("heal")
    conf = node.conf("sriov-ipam", 100, "02:4e:a1:00:00:07")
    node.add_or_del("ADD", conf, "killed", pod)
    store = node.work / "ipam" / "heal-sriov-ipam"
    lock = os.open(store / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        # sriov-ipam's lock held: the DEL gives the VF back, then waits for its address.
        fcntl.flock(lock, fcntl.LOCK_EX)
        deleting = node.start_call("DEL", conf, "killed", pod, node.args("killed"))
        wait_until(lambda: view(host_link(vf_names[0])) == netdev_before, BOUND, "the DEL to give the VF back")
        # The runtime's call killed (as the runtime is): the daemon ends the call it ran.
        deleting.kill()
        deleting.communicate()
        wait_until(lambda: not daemon.children(), BOUND, "the daemon to end the killed call")
    finally:
        os.close(lock)
    assert node.records() == ["killed"]
    assert len(node.reservations()) == 1
    # No DEL comes again: the pod goes.
    subprocess.run(["ip", "netns", "del", pod], check=True)
    _gone_within_bound(node, {"killed"})
    assert vfinfo(node.pf, 0) == before
    assert node.reservations() == set()
    assert node.given_back() == {("netns gone", "given_back"): 1.0}
