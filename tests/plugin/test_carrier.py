"""ADD returns once the VF has carrier, when its PF has carrier; CHECK reports a VF without it.

Real: the "VF" is one end of a veth pair, and its carrier is the kernel's
(it has carrier once both ends are up), read back with ``ip -j``.  Fixture:
the PF exists only in the test's sysfs tree, whose ``carrier`` file the
test writes; the PF side of the VF is the fake VF control.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from tests.support.pluginlib import Node, Ready, link


def pod_carrier(pod: str) -> bool:
    entry = link("net1", os.path.basename(pod))
    return entry is not None and "LOWER_UP" in entry["flags"]


def conf(node: Node, **keys: Any) -> dict[str, Any]:
    return node.conf(ipam=node.sriov_ipam(), **keys)


def test_add_returns_once_the_vf_has_carrier(ready: Ready) -> None:
    node, pod, _ = ready
    node.pf_carrier("1")
    node.carrier_wait = 30.0
    # The far end comes up while ADD runs, as a VF driver's watchdog reports
    # the link a while after the VF was opened.
    later = threading.Timer(1.0, node.vf_peer, (0, "up"))
    later.start()
    try:
        node.add(conf(node), netns=pod)
    finally:
        later.join()
    assert pod_carrier(pod)


def test_add_fails_and_gives_the_vf_back_when_it_gets_no_carrier_while_its_pf_has(ready: Ready) -> None:
    node, pod, before = ready
    node.pf_carrier("1")
    node.carrier_wait = 1.0
    res = node.cni("ADD", conf(node, deviceID=node.pfs[0].vfs[0].pci), netns=pod)
    assert res.rc != 0 and res.out["code"] == 100, res.stdout
    assert "no carrier" in res.out["msg"] and node.pfs[0].name in res.out["msg"], res.out
    assert node.picture() == before


def test_no_wait_while_the_pf_has_no_carrier(ready: Ready) -> None:
    """A VF without carrier is attached at once: a wait would end in the failure above."""
    node, pod, _ = ready
    node.carrier_wait = 1.0
    for state in ("0", None):
        node.pf_carrier(state)
        node.add(conf(node), netns=pod)
        assert not pod_carrier(pod)
        assert node.cni("DEL", conf(node), netns=pod).rc == 0


def test_no_wait_for_a_vf_whose_link_is_disabled(ready: Ready) -> None:
    node, pod, _ = ready
    node.pf_carrier("1")
    node.carrier_wait = 1.0
    node.add(conf(node, link_state="disable"), netns=pod)
    assert not pod_carrier(pod)


def test_check_reports_a_vf_that_lost_carrier_while_its_pf_has_it(ready: Ready) -> None:
    node, pod, _ = ready
    node.pf_carrier("1")
    node.vf_peer(0, "up")
    cfg = conf(node)
    res = node.add(cfg, netns=pod)
    with_prev = dict(cfg, prevResult=res.out)
    assert node.cni("CHECK", with_prev, netns=pod).rc == 0

    node.vf_peer(0, "down")
    deadline = time.monotonic() + 10
    while pod_carrier(pod) and time.monotonic() < deadline:
        time.sleep(0.05)
    res = node.cni("CHECK", with_prev, netns=pod)
    assert res.rc != 0 and "no carrier" in res.out["details"], res.stdout

    node.pf_carrier("0")
    assert node.cni("CHECK", with_prev, netns=pod).rc == 0
