"""Per-pod VF counters on the real igb/igbvf driver (the rig's QEMU guest): what a scrape shows for pods that talk.

Real: the guest's kernel, igb and igbvf, the daemon and its exporter, the
static shim as the runtime's ``sriov``, host-local.  Two pods ping and one
sends the other a known volume over TCP (python3 in ``ip netns exec``); a
third stays idle; the daemon is scraped before and after, and after the
idle pod's DEL.

What igb reports: QEMU's emulated 82576 and the igb driver give no per-VF
counters.  igb has no ``ndo_get_vf_stats``, so the kernel's IFLA_VF_STATS
for each of its VFs holds zeros (``ip -s -d link show <pf>`` shows them per
VF), however much the VF moves.  So the exporter's series are asserted to
be what the PF reports (zeros, read from the kernel, not a fake), and the
traffic's volume is checked on the pods' own netdevs, where it shows; on a
driver that reports per-VF counters the same test asserts the rise in the
exporter's series (see ``reports_vf_counters``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.vm.plugincalls import ping
from tests.vm.shimnode import ShimNode
from tests.vm.vmlib import Sriov, ip_json

pytestmark = pytest.mark.sriov_vm

VOLUME = 10 * 1024 * 1024
# What an idle pod's VF may move between two scrapes a few seconds apart:
# IPv6 router and neighbour solicitations, MLD reports and the odd ARP
# its neighbours send; a few kB at most, far below the volume.
IDLE_TOLERANCE = 64 * 1024
SUBNET = {"subnet": "10.84.0.0/24", "rangeStart": "10.84.0.10", "rangeEnd": "10.84.0.99"}
RECEIVER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 5201))
    s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept()
    got = 0
    while chunk := c.recv(1 << 16):
        got += len(chunk)
    print(got, flush=True)
    """
)
SENDER = textwrap.dedent(
    """
    import socket, sys
    c = socket.create_connection((sys.argv[1], 5201), timeout=30)
    block = bytes(1 << 16)
    left = int(sys.argv[2])
    while left > 0:
        left -= c.send(block[: min(left, len(block))])
    c.shutdown(socket.SHUT_WR)
    c.close()
    """
)


class Node(ShimNode):
    """The shim and the daemon over the test's store, on one PF, with one network (host-local)."""

    def __init__(self, work: Path, pf: str) -> None:
        super().__init__(work)
        self.pf = pf
        self.start()

    def call_pod(self, command: str, pod_name: str, netns: str) -> dict[str, Any]:
        conf = {
            "cniVersion": "1.0.0",
            "name": "counters",
            "type": "sriov",
            "pfNames": [self.pf],
            "dataDir": str(self.state),
            "ipam": {"type": "host-local", "dataDir": str(self.work / "ipam"), "ranges": [[SUBNET]]},
        }
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=traffic;K8S_POD_NAME={pod_name};K8S_POD_UID=u-{pod_name}"
        return self.call(command, conf, f"ctr-{pod_name}", netns, args)

    def pod_series(self) -> tuple[str, dict[str, dict[str, float]], dict[str, dict[str, str]]]:
        """The exposition, each pod's VF series by name, and each pod's labels."""
        text = self.scrape()
        series: dict[str, dict[str, float]] = {}
        labels: dict[str, dict[str, str]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("sriov_cni_pod_vf_"):
                    series.setdefault(s.labels["pod"], {})[s.name] = s.value
                    labels[s.labels["pod"]] = dict(s.labels)
        return text, series, labels


@pytest.fixture
def node(igb_pfs: list[str], tmp_path: Path, sriov: Sriov) -> Iterator[Node]:
    sriov.enable(igb_pfs[0], 3)
    n = Node(tmp_path, igb_pfs[0])
    yield n
    n.close()


def pf_vf_stats(pf: str) -> dict[int, dict[str, int]]:
    """What ``ip -s -d link show <pf>`` reports of each VF's counters (the kernel's IFLA_VF_STATS), flattened."""
    [link] = ip_json("-s", "-d", "link", "show", "dev", pf)
    out = {}
    for info in link["vfinfo_list"]:
        # iproute2 prints them whenever the kernel sent IFLA_VF_STATS: rx
        # with bytes and packets, tx with its own subset.
        out[info["vf"]] = {
            f"{side}_{name}": int(n) for side, counts in info["stats"].items() for name, n in counts.items()
        }
    return out


def netdev_bytes(netns: str) -> tuple[int, int]:
    """The pod's VF netdev's own (rx, tx) bytes, as igbvf counts them inside the pod."""
    [link] = ip_json("-s", "link", "show", "dev", "net1", netns=netns)
    return int(link["stats64"]["rx"]["bytes"]), int(link["stats64"]["tx"]["bytes"])


def send(sender: str, receiver: str, address: str, volume: int) -> int:
    """``volume`` bytes from pod ``sender`` to ``address`` in pod ``receiver``; what the receiver counted."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", receiver, sys.executable, "-c", RECEIVER, address],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        subprocess.run(
            ["ip", "netns", "exec", sender, sys.executable, "-c", SENDER, address, str(volume)], check=True, timeout=300
        )
        out, _ = server.communicate(timeout=300)
    finally:
        if server.poll() is None:
            server.kill()
    return int(out.strip())


def test_two_talking_pods_counters_rise_an_idle_pods_stay_flat_and_a_deleted_pods_go(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = {name: node.pod("cnt") for name in ("talker", "listener", "idle")}
    addresses = {
        name: node.call_pod("ADD", name, netns)["ips"][0]["address"].split("/")[0] for name, netns in pods.items()
    }
    ping(pods["talker"], addresses["listener"])
    ping(pods["listener"], addresses["talker"])
    time.sleep(2)  # let the links' first announcements pass before the baseline
    _, before, labels = node.pod_series()
    assert set(before) == set(pods), before
    netdevs_before = {name: netdev_bytes(netns) for name, netns in pods.items()}
    pf_before = pf_vf_stats(node.pf)

    received = send(pods["talker"], pods["listener"], addresses["listener"], VOLUME)
    assert received == VOLUME
    ping(pods["talker"], addresses["listener"])

    text, after, labels = node.pod_series()
    pf_after = pf_vf_stats(node.pf)
    netdevs_after = {name: netdev_bytes(netns) for name, netns in pods.items()}
    # The traffic happened, as the pods' own netdevs count it.
    assert netdevs_after["talker"][1] - netdevs_before["talker"][1] >= VOLUME
    assert netdevs_after["listener"][0] - netdevs_before["listener"][0] >= VOLUME
    idle_moved = sum(netdevs_after["idle"]) - sum(netdevs_before["idle"])
    assert idle_moved <= IDLE_TOLERANCE

    def rise(pod: str, name: str) -> float:
        return after[pod][f"sriov_cni_pod_vf_{name}_total"] - before[pod][f"sriov_cni_pod_vf_{name}_total"]

    reports_vf_counters = any(any(v.values()) for v in pf_after.values())
    if reports_vf_counters:
        assert rise("talker", "transmit_bytes") >= VOLUME
        assert rise("listener", "receive_bytes") >= VOLUME
        assert rise("idle", "receive_bytes") + rise("idle", "transmit_bytes") <= IDLE_TOLERANCE
    else:
        # igb: the PF reports every VF's counters as zeros, before and after
        # 10 MiB went through two of them; the exporter serves exactly that.
        assert pf_before == pf_after and all(not any(v.values()) for v in pf_after.values()), pf_after
        for pod in pods:
            assert set(after[pod].values()) == {0.0}, (pod, after[pod])
    # Each pod's series are labelled with its pod, its VF and its PF.
    for pod in pods:
        assert labels[pod]["namespace"] == "traffic" and labels[pod]["interface"] == "net1"
        assert labels[pod]["pf"] == node.pf and labels[pod]["network"] == "counters"
    lines = [line for line in text.splitlines() if 'pod="talker"' in line]

    node.call_pod("DEL", "idle", pods["idle"])
    _, gone, _ = node.pod_series()
    assert set(gone) == {"talker", "listener"}

    with capsys.disabled():
        sys.stdout.write(
            f"\npod counters on igb: PF reports per-VF counters: {reports_vf_counters}; "
            f"PF's view of the VFs after: {pf_after}\n"
            f"netdev bytes (rx, tx) before {netdevs_before} after {netdevs_after}; idle moved {idle_moved} B; "
            f"VFs { ({pod: labels[pod]['vf'] for pod in pods}) }\n" + "\n".join(lines) + "\n"
        )
