"""What a live pod built on its VF goes at DEL, before the VF goes back (runs in the rig's QEMU guest).

Real: the guest's Debian 6.1 kernel with every kind's module
(tests/vm/rig.py), igb/igbvf VFs, the plugin in process, ``ip`` and
``ping``.  The first test's VFs are veths with the fake PF side of the
host tests (tests/support/pluginlib.py), run here because the host's
kernel lacks most of the kinds; the second's are igb VFs.  The oracle is
``ip -j -d link`` in the pods, and traffic.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.pluginlib import Node as VethNode
from tests.support.riders import GUEST_KINDS, del_leaves_nothing_of, links
from tests.vm.plugincalls import Pod, cni, conf, ns_path, ping, records, restored, vfinfo
from tests.vm.vmlib import Sriov

pytestmark = pytest.mark.sriov_vm


@pytest.fixture
def veth_node(tmp_path: Path) -> Iterator[VethNode]:
    n = VethNode(tmp_path)
    try:
        yield n
    finally:
        n.cleanup()


@pytest.mark.parametrize("kind", GUEST_KINDS)
def test_del_removes_every_kind_a_pod_can_build_on_its_vf(veth_node: VethNode, kind: str) -> None:
    del_leaves_nothing_of(veth_node, kind)


def sh(netns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", netns, *cmd], capture_output=True, text=True, check=False)


def vlan10(netns: str, address: str) -> None:
    """The pod's own VLAN 10 on its VF, as a telco pod makes it."""
    for cmd in (
        ("ip", "link", "add", "link", "net1", "name", "net1.10", "type", "vlan", "id", "10"),
        ("ip", "addr", "add", f"{address}/24", "dev", "net1.10"),
        ("ip", "link", "set", "net1.10", "up"),
    ):
        out = sh(netns, *cmd)
        assert out.returncode == 0, f"{' '.join(cmd)}: {out.stderr}"


def test_a_pod_keeps_nothing_on_a_vf_given_back_while_it_runs(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """Multus removing one network from a live pod: its VLAN and macvlan on the VF must not outlive the VF."""
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    before = vfinfo(pf, 0)
    # 1.1.0: the result names the VF (pciID).
    cfg = dict(conf(tmp_path, pf, None, Pod(None, None)), cniVersion="1.1.0")
    old, peer = netns(), netns()
    rc, res = cni("ADD", cfg, container="old", netns=ns_path(old))
    assert rc == 0, res
    old_vf = res["interfaces"][0]["pciID"]
    rc, res = cni("ADD", cfg, container="peer", netns=ns_path(peer))
    assert rc == 0, res
    peer_address = res["ips"][0]["address"].split("/")[0]
    vlan10(old, "10.84.10.1")
    vlan10(peer, "10.84.10.3")
    out = sh(old, "ip", "link", "add", "link", "net1", "name", "mv0", "type", "macvlan", "mode", "bridge")
    assert out.returncode == 0, out.stderr
    # The old pod's VLAN carries traffic to the peer's through the NIC, so
    # its absence after DEL is the VF's doing, not a path that never worked.
    ping(old, "10.84.10.3")

    rc, out_del = cni("DEL", cfg, container="old", netns=ns_path(old))
    assert rc == 0, out_del
    # What a new namespace has (lo, and the tunnel modules' fallback devices).
    assert set(links(old)) == set(links(netns()))
    # Sending on its former VLAN reaches nobody: it has nothing left to send on.
    sent = sh(old, "ping", "-c", "1", "-W", "1", "10.84.10.3")
    assert sent.returncode != 0 and "unreachable" in (sent.stdout + sent.stderr).lower(), sent

    nxt = netns()
    rc, res = cni("ADD", cfg, container="next", netns=ns_path(nxt))
    assert rc == 0, res
    assert res["interfaces"][0]["pciID"] == old_vf
    ping(nxt, peer_address)
    ping(peer, res["ips"][0]["address"].split("/")[0])
    vlan10(nxt, "10.84.10.2")
    ping(nxt, "10.84.10.3")

    for container, ns in (("next", nxt), ("peer", peer)):
        rc, out_del = cni("DEL", cfg, container=container, netns=ns_path(ns))
        assert rc == 0, out_del
    restored(vfinfo(pf, 0), before)
    assert records(tmp_path) == []
