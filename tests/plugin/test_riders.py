"""DEL leaves nothing in a live pod that rides the VF it gives back; CHECK names such devices.

Real: the host kernel's veth, macvlan, macvtap, vxlan and bridge in
throwaway namespaces (the other kinds of tests/support/riders.py need
modules this kernel lacks: tests/vm/test_riders_igb.py runs them all on
the guest's kernel), the plugin's netlink requests, the store on disk.
Fixtures: veths stand in for VFs, the PF side is the fake of
:class:`pluginlib.Node`.  The oracle is ``ip -j -d link`` in the pod.
"""

from __future__ import annotations

import pytest

from tests.support.pluginlib import Node
from tests.support.riders import HOST_KINDS, del_leaves_nothing_of


@pytest.mark.parametrize("kind", HOST_KINDS)
def test_del_removes_what_the_pod_built_on_its_vf(node: Node, kind: str) -> None:
    del_leaves_nothing_of(node, kind)
