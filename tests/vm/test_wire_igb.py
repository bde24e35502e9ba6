"""Pods on VFs of two igb PFs joined by a wire, and what their settings put on it (rig.py --wire).

Real: the guest's kernel (Debian 12's, or Linux 7.2/7.3 for the RDMA tests)
with igb and igbvf on QEMU's emulated 82576, the plugin with its real
dependencies, sriov-ipam, the pods' own kernel stacks (ping, raw sockets,
rdma_rxe), and the wire itself: the rig joins the two PFs' ports on one QEMU
hub, so a frame between pods on different PFs leaves one emulated NIC and
enters the other.  The oracle is the wire's capture (QEMU's filter-dump on
PF 0's port, read with wirelib), not the plugin: what a setting really put
on the frames.  No fixture stands in for a VF or a pod.

Which boot runs what: the one-node tests need ``--wire`` alone (one guest,
its two PFs on the segment); the ``peer_vm`` tests need ``--wire --peer``,
a second guest (a second node, its own kernel, the plugin run there as
``bin/sriov``) whose PFs join the segment over QEMU's datagram link.  The
second guest costs a boot and a TCG thread for the whole run, so only the
tests about two nodes ask for it.

Where QEMU's igb (10.0) does not emulate what the PF was told, the test
asserts what does cross the wire and says so: spoof checking and the VF's
transmit rate are set in the PF's registers (``ip -d link`` shows them) and
not enforced by the emulation.  The frames that only cross one PF's switch,
between two VFs of the same PF, are shown not to reach the wire.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.plugin.rdma import soft_name
from tests.vm.plugincalls import CNI_PATH, cni, ns_path, records, vfinfo
from tests.vm.rdmalib import BOUND, IB_WRITE_BW_PORT, PINGPONG_PORT, roce_v2_gid_index, run_pair, watched_output
from tests.vm.vmlib import Sriov
from tests.vm.wirelib import (
    ETH_P_ARP,
    ETH_P_SENTINEL,
    ETH_P_TEST,
    ICMP_ECHO_REPLY,
    ICMP_ECHO_REQUEST,
    ROCE_V2_PORT,
    Frame,
    Listener,
    Peer,
    Tag,
    Wire,
    guest_peer,
    guest_wire,
    send_frames,
)

pytestmark = [pytest.mark.sriov_vm, pytest.mark.wire_vm]

# VFs made once for the module on each of the two PFs: every test's pods fit.
VFS_PER_PF = 4
SUBNET = "10.83.0.0/24"


@dataclass(frozen=True)
class Attached:
    """One pod attached by the plugin: its namespace, PF, VF index, address and MAC."""

    netns: str
    pf: str
    vf: int
    pci: str
    address: str
    mac: str
    conf: dict[str, Any]
    container: str


@pytest.fixture(scope="module")
def wire() -> Wire:
    return guest_wire()


@pytest.fixture(scope="module")
def two_pfs(igb_pfs: list[str]) -> Iterator[list[str]]:
    """The two wired PFs, each with VFS_PER_PF VFs for the module; back to none at its end."""
    if len(igb_pfs) < 2:
        pytest.fail(f"the wire tests need two PFs, the guest has {igb_pfs}")
    pfs = igb_pfs[:2]
    ctl = Sriov(pfs)
    for pf in pfs:
        ctl.enable(pf, VFS_PER_PF)
    yield pfs
    ctl.restore()


@pytest.fixture
def attach(two_pfs: list[str], netns: Callable[[], str], tmp_path: Path) -> Iterator[Callable[..., Attached]]:
    """``attach(pf, **keys)``: ADD a pod on a VF of ``pf`` with the config ``keys``; every pod is DELeted at the end.

    The pods of a test share one sriov-ipam range, so each has its own
    address on the one segment; the VF's carrier is awaited.
    """
    made: list[Attached] = []
    ipam = {"type": "sriov-ipam", "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": SUBNET}]]}

    def add(pf: str, **keys: Any) -> Attached:
        conf = {
            "cniVersion": "1.1.0",
            "name": "wirenet",
            "type": "sriov",
            "pfNames": [pf],
            "dataDir": str(tmp_path),
            "ipam": ipam,
            **keys,
        }
        pod = netns()
        container = f"wire{len(made)}"
        rc, res = cni("ADD", conf, container=container, netns=ns_path(pod))
        assert rc == 0, res
        pci = res["interfaces"][0]["pciID"]
        made.append(
            Attached(
                pod,
                pf,
                _vf_index(pf, pci),
                pci,
                res["ips"][0]["address"].split("/")[0],
                res["interfaces"][0]["mac"],
                conf,
                container,
            )
        )
        return made[-1]

    yield add
    for pod in made:
        rc, res = cni("DEL", pod.conf, container=pod.container, netns=ns_path(pod.netns))
        assert rc == 0, res
    assert records(tmp_path) == []


def _vf_index(pf: str, pci: str) -> int:
    device = Path(f"/sys/class/net/{pf}/device")
    [index] = [int(link.name[6:]) for link in device.glob("virtfn*") if link.resolve().name == pci]
    return index


def carriers(sriov_pods: list[Attached]) -> None:
    ctl = Sriov([])
    for pod in sriov_pods:
        ctl.wait_carrier("net1", pod.netns)


def pings(pod: Attached, address: str, count: int = 2) -> bool:
    """Whether ``pod`` gets ``count`` echo replies from ``address`` (a lost one fails it)."""
    proc = subprocess.run(
        ["ip", "netns", "exec", pod.netns, "ping", "-c", str(count), "-i", "0.2", "-W", "2", address],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


def echoes(frames: list[Frame], src: Attached, dst: Attached, kind: int) -> list[Frame]:
    """The ICMP echo requests (or replies) from ``src`` to ``dst`` among ``frames``, by MAC and address."""
    return [
        f
        for f in frames
        if f.src == src.mac and f.dst == dst.mac and f.ipv4() == (src.address, dst.address) and f.icmp_type() == kind
    ]


def test_pods_on_two_pfs_ping_across_the_wire_and_one_pfs_pods_do_not(
    two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """Pods on PF 0 and PF 1 reach each other both ways over the wire, untagged.

    Two pods on the same PF talk too, but their unicast turns around in the
    PF's own switch (the 82576's VM-to-VM loopback, which QEMU emulates):
    none of their echoes is on the wire.
    """
    a = attach(two_pfs[0])
    a2 = attach(two_pfs[0])
    b = attach(two_pfs[1])
    carriers([a, a2, b])

    mark = wire.mark()
    assert pings(a, b.address) and pings(b, a.address)
    assert pings(a, a2.address) and pings(a2, a.address)
    frames = wire.since(mark)

    for one, other in ((a, b), (b, a)):
        requests = echoes(frames, one, other, ICMP_ECHO_REQUEST)
        replies = echoes(frames, other, one, ICMP_ECHO_REPLY)
        assert len(requests) == 2 and len(replies) == 2, (one, other, frames)
        assert all(f.tags == () for f in requests + replies)
    same_pf = [f for f in frames if {f.src, f.dst} == {a.mac, a2.mac} and f.icmp_type() is not None]
    assert same_pf == []


def test_vlan_tag_and_priority_on_the_wire_and_vlans_apart(
    two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """``vlan`` and ``vlanQoS``: the PF tags each frame its VF sends, and only same-VLAN pods meet.

    A (PF 0, VLAN 100, priority 3) and B (PF 1, VLAN 100, priority 5) ping
    each other: each frame on the wire carries one 802.1Q tag, its sender's
    VLAN and priority.  D (PF 1, VLAN 200) and C (PF 1, no VLAN) never
    answer A, whose requests for them are on the wire tagged 100; C, the
    pod without a VLAN, receives none of A's tagged frames (counted by a
    listener in C until a sentinel the node sends untagged from PF 0 has
    reached it).
    """
    a = attach(two_pfs[0], vlan=100, vlanQoS=3)
    b = attach(two_pfs[1], vlan=100, vlanQoS=5)
    d = attach(two_pfs[1], vlan=200)
    c = attach(two_pfs[1])
    carriers([a, b, d, c])
    assert vfinfo(a.pf, a.vf)["vlan_list"] == [{"vlan": 100, "qos": 3}]
    assert vfinfo(b.pf, b.vf)["vlan_list"] == [{"vlan": 100, "qos": 5}]

    listener = Listener(c.netns, "net1")
    mark = wire.mark()
    assert pings(a, b.address) and pings(b, a.address)
    assert not pings(a, d.address, 1)
    assert not pings(a, c.address, 1)
    send_frames(None, two_pfs[0], "02:00:00:00:5e:00", 1, ethertype=ETH_P_SENTINEL)
    seen = listener.counts()
    frames = wire.since(mark)

    from_a = [f for f in frames if f.src == a.mac]
    from_b = [f for f in frames if f.src == b.mac]
    assert len(echoes(frames, a, b, ICMP_ECHO_REQUEST)) == 2 and len(echoes(frames, b, a, ICMP_ECHO_REPLY)) == 2
    assert len(echoes(frames, b, a, ICMP_ECHO_REQUEST)) == 2 and len(echoes(frames, a, b, ICMP_ECHO_REPLY)) == 2
    assert {f.tags for f in from_a} == {(Tag(0x8100, 3, 0, 100),)}
    assert {f.tags for f in from_b} == {(Tag(0x8100, 5, 0, 100),)}
    asked = {f.arp_target() for f in from_a if f.ethertype == ETH_P_ARP}
    assert {d.address, c.address} <= asked, asked
    assert [f for f in frames if f.src in (c.mac, d.mac) and f.dst == a.mac] == []
    assert [r for r in seen if r.src == a.mac] == [], seen


def test_spoofchk_is_set_on_the_pf_and_qemu_passes_spoofed_frames(
    two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """``spoofchk``: what the PF is told, and what a pod sending from a MAC not its own puts on the wire.

    On a real 82576 the PF drops a spoof-checked VF's frames whose source
    MAC is not the VF's.  QEMU 10.0's igb does not emulate that check (the
    PF's DTXSWC register is written and never read): the spoofed frames of
    both pods cross the wire, which this test counts.  Should QEMU come to
    drop them, the count for the ``on`` pod fails here, and the assertion
    becomes the drop.
    """
    checked = attach(two_pfs[0], spoofchk="on", mac="02:00:00:00:5c:01")
    unchecked = attach(two_pfs[0], spoofchk="off", mac="02:00:00:00:5c:02")
    carriers([checked, unchecked])
    assert vfinfo(checked.pf, checked.vf)["spoofchk"] is True
    assert vfinfo(unchecked.pf, unchecked.vf)["spoofchk"] is False

    forged = {checked.netns: "02:00:00:00:5f:01", unchecked.netns: "02:00:00:00:5f:02"}
    mark = wire.mark()
    for pod in (checked, unchecked):
        # The spoofed frames first, then as many from the pod's own MAC:
        # one queue sends them in order, so once the own ones are on the
        # wire, every spoofed one that was going to be is there too.
        send_frames(pod.netns, "net1", forged[pod.netns], 20)
        send_frames(pod.netns, "net1", pod.mac, 20)
    frames = wire.wait_for(
        mark,
        lambda fs: all(
            sum(f.src == p.mac and f.ethertype == ETH_P_TEST for f in fs) == 20 for p in (checked, unchecked)
        ),
        "each pod's 20 frames from its own MAC",
    )
    counted = {mac: sum(f.src == mac and f.ethertype == ETH_P_TEST for f in frames) for mac in forged.values()}
    assert counted == {"02:00:00:00:5f:01": 20, "02:00:00:00:5f:02": 20}


def test_trust_lets_a_pod_change_its_mac_and_promiscuous_mode_floods_nothing(
    two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """``trust``: a trusted pod may change its VF's MAC, and the new one is what crosses the wire; an untrusted one may not.

    igb refuses an untrusted VF's MAC change while the PF holds a MAC for
    it (the plugin sets ``mac``): the pod's ``ip link set address`` fails,
    its frames keep the old MAC.  The trusted pod's change goes through the
    PF: the PF's view shows it and B (on PF 1) reaches it at its new MAC.
    Promiscuous mode in the trusted pod floods it nothing: igbvf asks the PF
    for no unicast promiscuity, so frames for another MAC never reach it
    (a listener counts them until a sentinel for its own MAC arrives).
    """
    trusted = attach(two_pfs[0], trust="on", mac="02:00:00:00:7a:01")
    untrusted = attach(two_pfs[0], trust="off", mac="02:00:00:00:7a:02")
    b = attach(two_pfs[1])
    carriers([trusted, untrusted, b])
    new = {trusted.netns: "02:00:00:00:7b:01", untrusted.netns: "02:00:00:00:7b:02"}

    changed = {
        pod.netns: subprocess.run(
            ["ip", "-n", pod.netns, "link", "set", "net1", "address", new[pod.netns]], capture_output=True, text=True
        )
        for pod in (trusted, untrusted)
    }
    assert changed[trusted.netns].returncode == 0, changed[trusted.netns].stderr
    assert changed[untrusted.netns].returncode != 0
    assert "Cannot assign requested address" in changed[untrusted.netns].stderr
    assert vfinfo(trusted.pf, trusted.vf)["address"] == new[trusted.netns]
    assert vfinfo(untrusted.pf, untrusted.vf)["address"] == untrusted.mac

    mark = wire.mark()
    assert pings(trusted, b.address) and pings(b, trusted.address)
    assert pings(untrusted, b.address)
    frames = wire.since(mark)
    moved = Attached(trusted.netns, trusted.pf, trusted.vf, trusted.pci, trusted.address, new[trusted.netns], {}, "")
    assert len(echoes(frames, moved, b, ICMP_ECHO_REQUEST)) == 2 and len(echoes(frames, b, moved, ICMP_ECHO_REPLY)) == 2
    assert [f for f in frames if f.src == trusted.mac or f.dst == trusted.mac] == []
    assert len(echoes(frames, untrusted, b, ICMP_ECHO_REQUEST)) == 2
    assert [f for f in frames if new[untrusted.netns] in (f.src, f.dst)] == []

    subprocess.run(["ip", "-n", trusted.netns, "link", "set", "net1", "promisc", "on"], check=True)
    listener = Listener(trusted.netns, "net1")
    send_frames(b.netns, "net1", b.mac, 10, dst="02:00:00:00:7c:01")
    send_frames(b.netns, "net1", b.mac, 10, dst=new[trusted.netns])
    send_frames(b.netns, "net1", b.mac, 1, dst=new[trusted.netns], ethertype=ETH_P_SENTINEL)
    seen = listener.counts()
    # Ten for its own MAC reached it; the ten for another MAC did not.
    assert [(r.dst, r.count) for r in seen if r.ethertype == ETH_P_TEST] == [(new[trusted.netns], 10)], seen


# A transfer the limit would stretch past this many times its unlimited
# length under TCG (about 200 Mbit/s here, idle): the rate measured is
# compared with the limit with this much room, so a loaded machine is not
# mistaken for an enforced limit.
RATE_FRAMES = 1000
FRAME_BYTES = 1514
MAX_TX_RATE = 1  # Mbit/s, the smallest the PF takes


def test_max_tx_rate_is_set_on_the_pf_and_qemu_sends_past_it_and_min_tx_rate_is_refused(
    two_pfs: list[str], attach: Callable[..., Attached], wire: Wire, tmp_path: Path, netns: Callable[[], str]
) -> None:
    """``max_tx_rate`` reaches the PF; QEMU 10.0's igb does not limit the VF (it does not emulate the 82576's rate limiters).

    The pod sends 1000 full frames, 12 Mbit: at 1 Mbit/s that takes 12 s on
    the wire.  The capture's time stamps show them sent at more than four
    times the limit.  ``min_tx_rate`` is refused by igb itself (it has no
    minimum rate; the PF answers EINVAL): ADD fails with code 100 and the
    VF is left as it was.
    """
    pod = attach(two_pfs[0], max_tx_rate=MAX_TX_RATE)
    carriers([pod])
    assert vfinfo(pod.pf, pod.vf)["rate"] == {"max_tx": MAX_TX_RATE, "min_tx": 0}

    mark = wire.mark()
    send_frames(pod.netns, "net1", pod.mac, RATE_FRAMES, size=FRAME_BYTES)
    frames = wire.wait_for(
        mark,
        lambda fs: sum(f.src == pod.mac and f.ethertype == ETH_P_TEST for f in fs) == RATE_FRAMES,
        f"the pod's {RATE_FRAMES} frames",
        timeout=120,
    )
    sent = [f for f in frames if f.src == pod.mac and f.ethertype == ETH_P_TEST]
    span = sent[-1].seconds - sent[0].seconds
    mbits = sum(f.length for f in sent) * 8 / 1e6
    print(f"{len(sent)} frames, {mbits:.1f} Mbit in {span:.3f} s on the wire with max_tx_rate {MAX_TX_RATE}")
    assert mbits / max(span, 1e-6) > 4 * MAX_TX_RATE

    other = netns()
    before = vfinfo(two_pfs[1], 0)
    conf = {
        "cniVersion": "1.1.0",
        "name": "wirenet",
        "type": "sriov",
        "pfNames": [two_pfs[1]],
        "dataDir": str(tmp_path / "refused"),
        "min_tx_rate": 10,
    }
    rc, res = cni("ADD", conf, container="minrate", netns=ns_path(other))
    # The driver's refusal, with the rates asked for (minimum-maximum).
    assert rc == 1 and res["code"] == 100 and "cannot set min_tx_rate/max_tx_rate" in res["msg"], res
    assert "tx rate 10-0 Mbps" in res["details"] and "Invalid argument" in res["details"], res
    assert vfinfo(two_pfs[1], 0) == before


def roce_between(frames: list[Frame], one: Attached, other: Attached) -> int:
    """RoCE v2 packets (UDP to port 4791) from ``one`` to ``other`` among ``frames``."""
    return sum(f.src == one.mac and f.dst == other.mac and (f.udp_ports() or (0, 0))[1] == ROCE_V2_PORT for f in frames)


def rdma_figures(server: Attached, client: Attached) -> tuple[float, float]:
    """ib_write_bw (200 writes of 4 KiB) and ibv_rc_pingpong (100 round trips) from ``client`` to ``server``.

    Returns the write bandwidth's average (Gbit/s) and the ping-pong's
    microseconds per round trip, as the tools print them.
    """
    pods = [server, client]
    devices = [soft_name(p.pci) for p in pods]
    gids = [roce_v2_gid_index(p.netns, d, p.address) for p, d in zip(pods, devices, strict=True)]
    # Shared mode: the devices' counters are read on the node.
    counters: list[tuple[str | None, str]] = [(None, d) for d in devices]
    netns = [p.netns for p in pods]

    def client_output(tool: list[str], gid_option: str, port: int) -> str:
        # perftest names the GID index -x, rdma-core's examples -g.
        _, out = run_pair(
            netns,
            counters,
            [*tool, "-d", devices[0], gid_option, str(gids[0])],
            [*tool, "-d", devices[1], gid_option, str(gids[1]), server.address],
            port,
        )
        return out

    return (
        bw_average(client_output(WRITE_BW, "-x", IB_WRITE_BW_PORT)),
        usec_per_iter(client_output(PINGPONG, "-g", PINGPONG_PORT)),
    )


# The two tools as both RDMA tests run them: 200 writes of 4 KiB, 100 round
# trips sleeping on completion events (see test_rdma_soft.py for why).
WRITE_BW = ["ib_write_bw", "-F", "-n", "200", "-s", "4096", "--report_gbits"]
PINGPONG = ["ibv_rc_pingpong", "-e", "-n", "100", "-p", str(PINGPONG_PORT)]


def bw_average(out: str) -> float:
    """ib_write_bw's average bandwidth (Gbit/s, with --report_gbits) from its report."""
    rows = out.splitlines()
    [header] = [n for n, line in enumerate(rows) if "BW average" in line]
    return float(rows[header + 1].split()[3])


def usec_per_iter(out: str) -> float:
    """ibv_rc_pingpong's microseconds per round trip from its report."""
    found = re.search(r"100 iters in [0-9.]+ seconds = ([0-9.]+) usec/iter", out)
    assert found, out
    return float(found.group(1))


@pytest.mark.parametrize("series", [pytest.param(s, marks=pytest.mark.rdma_vm(s)) for s in ("7.2", "7.3")])
def test_soft_roce_pods_across_the_wire_beside_one_pfs(
    series: str, two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """``"rdma": "soft"`` pods move RDMA traffic over the wire as RoCE v2, and a same-PF pair in the same boot does not.

    Real: rdma_rxe on the newer kernel, in shared mode, over the pods' VFs;
    ib_write_bw and ibv_rc_pingpong of perftest and rdma-core in the pods.
    A (PF 0) and B (PF 1): every RDMA message is UDP to port 4791 on the
    wire, counted in the capture.  A and A2 (both PF 0): the same tools,
    and not one RoCE packet on the wire (one PF's switch).  Both pairs'
    figures are printed side by side; they are TCG's, not a NIC's.
    """
    a = attach(two_pfs[0], rdma="soft")
    a2 = attach(two_pfs[0], rdma="soft")
    b = attach(two_pfs[1], rdma="soft")
    carriers([a, a2, b])

    figures = {}
    for where, server, client, expected in (("across the wire", a, b, True), ("one PF's switch", a, a2, False)):
        mark = wire.mark()
        figures[where] = rdma_figures(server, client)
        frames = wire.since(mark)
        sent, answered = roce_between(frames, client, server), roce_between(frames, server, client)
        print(f"{series} {where}: RoCE v2 on the wire {sent} client to server, {answered} back")
        if expected:
            # At least a packet per write and per ping, and per pong back.
            assert sent >= 200 + 100 and answered >= 100, (sent, answered)
        else:
            assert (sent, answered) == (0, 0)
    for where, (gbits, usec) in figures.items():
        print(f"{series} {where}: ib_write_bw {gbits:.3f} Gbit/s average, ibv_rc_pingpong {usec:.1f} usec/iter")


# The other node's sriov-ipam hands out addresses from the top of the same
# subnet: one segment, two nodes' stores.
PEER_RANGE = {"subnet": SUBNET, "rangeStart": "10.83.0.200", "rangeEnd": "10.83.0.250"}
REPO = Path(__file__).resolve().parents[2]


def on_peer(peer: Peer, argv: list[str], **kw: Any) -> str:
    """``argv`` on the other node; its output, or the test fails with what it said."""
    proc = peer.run(argv, **kw)
    assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    return proc.stdout


@contextmanager
def pod_on_peer(peer: Peer, pf: str, **keys: Any) -> Iterator[Attached]:
    """A pod on the other node, on a VF of its ``pf``, with the config ``keys``; DELeted after.

    The plugin runs there as a runtime runs it: ``bin/sriov`` with the CNI
    environment and the config on stdin.
    """
    netns = "wirepeer0"
    conf = {
        "cniVersion": "1.1.0",
        "name": "wirenet",
        "type": "sriov",
        "pfNames": [pf],
        "dataDir": "/tmp/wirepeer",
        "ipam": {"type": "sriov-ipam", "dataDir": "/tmp/wirepeer/ipam", "ranges": [[PEER_RANGE]]},
        **keys,
    }
    cni_env = {"CNI_CONTAINERID": "peer0", "CNI_NETNS": ns_path(netns), "CNI_IFNAME": "net1", "CNI_PATH": CNI_PATH}
    plugin = [str(REPO / "bin" / "sriov")]
    on_peer(peer, [sys.executable, "-c", f"from tests.vm.vmlib import Sriov; Sriov([{pf!r}]).enable({pf!r}, 1)"])
    on_peer(peer, ["ip", "netns", "add", netns])
    try:
        res = json.loads(on_peer(peer, plugin, env={**cni_env, "CNI_COMMAND": "ADD"}, stdin=json.dumps(conf)))
        on_peer(
            peer, [sys.executable, "-c", f"from tests.vm.vmlib import Sriov; Sriov([]).wait_carrier('net1', {netns!r})"]
        )
        [interface] = res["interfaces"]
        yield Attached(
            netns, pf, 0, interface["pciID"], res["ips"][0]["address"].split("/")[0], interface["mac"], conf, "peer0"
        )
    finally:
        on_peer(peer, plugin, env={**cni_env, "CNI_COMMAND": "DEL"}, stdin=json.dumps(conf))
        on_peer(peer, ["ip", "netns", "delete", netns])
        on_peer(peer, [sys.executable, "-c", f"from tests.vm.vmlib import Sriov; Sriov([{pf!r}]).restore()"])


@pytest.mark.peer_vm
def test_pods_on_two_nodes_talk_over_the_wire_on_their_vlan(
    two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """A pod on this node and one on the other node (a second guest, its own kernel), both on VLAN 100.

    Real on the other node too: its igb PF and VF, and the plugin.  The two
    nodes' PFs share the wire through QEMU's datagram link: each pod's
    echoes cross it tagged with VLAN 100 and its node's priority.
    """
    peer = guest_peer()
    here = attach(two_pfs[0], vlan=100, vlanQoS=2)
    with pod_on_peer(peer, two_pfs[0], vlan=100, vlanQoS=6) as there:
        carriers([here])
        mark = wire.mark()
        assert pings(here, there.address)
        on_peer(peer, ["ip", "netns", "exec", there.netns, "ping", "-c", "2", "-i", "0.2", "-W", "2", here.address])
        frames = wire.since(mark)

    for one, other in ((here, there), (there, here)):
        assert len(echoes(frames, one, other, ICMP_ECHO_REQUEST)) == 2, (one, other, frames)
        assert len(echoes(frames, other, one, ICMP_ECHO_REPLY)) == 2, (one, other, frames)
    assert {f.tags for f in frames if f.src == here.mac} == {(Tag(0x8100, 2, 0, 100),)}
    assert {f.tags for f in frames if f.src == there.mac} == {(Tag(0x8100, 6, 0, 100),)}


def serve_on_peer(peer: Peer, there: Attached, server: list[str], port: int, log: str) -> None:
    """``server`` in the other node's pod, in the background with its output in ``log``, once it listens on ``port``."""
    on_peer(peer, ["sh", "-c", f"ip netns exec {there.netns} {shlex.join(server)} >{log} 2>&1 &"])
    deadline = time.monotonic() + BOUND
    while f":{port} " not in on_peer(peer, ["ip", "netns", "exec", there.netns, "ss", "-Hltn"]):
        if time.monotonic() > deadline:
            pytest.fail(f"nothing listens on {port} in the other node's pod within {BOUND:.0f} s")
        time.sleep(0.2)


def server_output(peer: Peer, server: list[str], log: str) -> str:
    """What ``server`` printed in its ``log`` on the other node, once it has ended (within BOUND)."""
    wait = f"while pgrep -x {server[0]} >/dev/null; do sleep 0.2; done"
    return on_peer(peer, ["sh", "-c", f"timeout {BOUND:.0f} sh -c {shlex.quote(wait)}; cat {log}"])


def client_here(here: Attached, device: str, client: list[str]) -> str:
    """``client`` in this node's pod, watched as long as RDMA packets move on its ``device``; its output."""
    return watched_output(["ip", "netns", "exec", here.netns, *client], [(None, device)], client[0])


@pytest.mark.peer_vm
@pytest.mark.parametrize("series", [pytest.param(s, marks=pytest.mark.rdma_vm(s)) for s in ("7.2", "7.3")])
def test_soft_roce_pods_on_two_nodes(
    series: str, two_pfs: list[str], attach: Callable[..., Attached], wire: Wire
) -> None:
    """``"rdma": "soft"`` pods on two nodes: ib_write_bw and ibv_rc_pingpong over the wire as RoCE v2.

    Real: rdma_rxe in shared mode on each node's kernel, the plugin on
    each node, perftest and rdma-core.  The server runs in the other node's
    pod, the client in this node's; the capture counts their RoCE v2
    packets both ways.  The figures (TCG's, two guests taking turns on two
    cores) are printed beside what the same-PF and cross-PF pairs of
    test_soft_roce_pods_across_the_wire_beside_one_pfs measured in this boot.
    """
    peer = guest_peer()
    here = attach(two_pfs[0], rdma="soft")
    with pod_on_peer(peer, two_pfs[0], rdma="soft") as there:
        carriers([here])
        devices = [soft_name(here.pci), soft_name(there.pci)]
        ours = roce_v2_gid_index(here.netns, devices[0], here.address)
        lookup = f"from tests.vm.rdmalib import roce_v2_gid_index as g; print(g({there.netns!r}, {devices[1]!r}, {there.address!r}))"
        theirs = int(on_peer(peer, [sys.executable, "-c", lookup]))

        mark = wire.mark()
        outputs, served = [], []
        for tool, gid_option, port in ((WRITE_BW, "-x", IB_WRITE_BW_PORT), (PINGPONG, "-g", PINGPONG_PORT)):
            server = [*tool, "-d", devices[1], gid_option, str(theirs)]
            log = f"/tmp/wirepeer/{tool[0]}.log"
            serve_on_peer(peer, there, server, port, log)
            outputs.append(
                client_here(here, devices[0], [*tool, "-d", devices[0], gid_option, str(ours), there.address])
            )
            served.append(server_output(peer, server, log))
        frames = wire.since(mark)

    assert "BW average" in served[0] and "100 iters" in served[1], served
    gbits, usec = bw_average(outputs[0]), usec_per_iter(outputs[1])
    sent, answered = roce_between(frames, here, there), roce_between(frames, there, here)
    print(f"{series} two nodes: RoCE v2 on the wire {sent} client to server, {answered} back")
    print(f"{series} two nodes: ib_write_bw {gbits:.3f} Gbit/s average, ibv_rc_pingpong {usec:.1f} usec/iter")
    assert sent >= 200 + 100 and answered >= 100, (sent, answered)
