"""DEL leaves nothing in a live pod that rides the VF it gives back; CHECK names such devices.

Real: the host kernel's veth, macvlan, macvtap, vxlan and bridge in
throwaway namespaces (the other kinds of tests/support/riders.py need
modules this kernel lacks: tests/vm/test_riders_igb.py runs them all on
the guest's kernel), the plugin's netlink requests, the store on disk.
Fixtures: veths stand in for VFs, the PF side is the fake of
:class:`pluginlib.Node`.  The oracle is ``ip -j -d link`` in the pod.
"""

from __future__ import annotations

import os

import pytest

from tests.support.pluginlib import Node, link
from tests.support.riders import HOST_KINDS, RIDERS, build, left_on


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_del_removes_what_the_pod_built_on_its_vf(node: Node, kind: str) -> None:
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    ns = os.path.basename(pod)
    conf = node.conf()
    res = node.add(conf, netns=pod, ifname="net1")
    rider = RIDERS[kind]
    build(ns, rider)

    check = node.cni("CHECK", dict(conf, prevResult=res.out), netns=pod, ifname="net1")
    assert check.rc != 0, check.stdout
    named = rider.made[0] if rider.made else rider.master
    assert named in check.out["details"] and "DEL" in check.out["details"], check.out

    assert node.cni("DEL", conf, netns=pod, ifname="net1").rc == 0

    assert left_on(ns, rider) == []
    assert link(vf.netdev) is not None
    assert node.records() == []
