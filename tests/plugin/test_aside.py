"""One VF that does not come up is set aside and another is tried, instead of failing every pod on it.

Real: the "VFs" are veths whose carrier is the kernel's (a veth has carrier
once both ends are up: a far end left down is the stand-in for a VF whose
driver never hears from its PF), the pods are namespaces, the store is on
disk.  Fixtures: the PF exists only in the test's sysfs tree, whose
``carrier`` file says it has carrier, and its side of the VFs is the fake
VF control, where a test sets a VF's ``link_state`` to disable behind the
plugin's back (what another tool does through the PF).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sriov_cni.kernel import vfsettings
from sriov_cni.node import status
from sriov_cni.plugin import aside
from sriov_cni.vfstore import FileStore
from tests.support.pluginlib import Node, link


def broken_first(node: Node, nvfs: int = 3) -> None:
    """A PF with carrier, ``nvfs`` VFs, all but the first with carrier once up."""
    node.add_pf(nvfs)
    node.pf_carrier("1")
    for vf in range(1, nvfs):
        node.vf_peer(vf, "up")
    node.carrier_wait = 1.0


def conf(node: Node, **keys: Any) -> dict[str, Any]:
    return node.conf(ipam=node.sriov_ipam(), **keys)


def vf_of(res: Any) -> str:
    return str(res.out["interfaces"][0]["pciID"])


def statuses(node: Node) -> dict[str, dict[str, Any]]:
    [pf] = status.gather(node.paths, node.data_dir, lambda name: link(name) is not None)
    return {vf["pci"]: vf for vf in pf["vfs"]}


def test_a_vf_without_carrier_is_set_aside_and_the_next_one_serves_the_pod(node: Node) -> None:
    broken_first(node)
    vf0, vf1, vf2 = (vf.pci for vf in node.pfs[0].vfs)
    cfg = conf(node, cniVersion="1.1.0")
    res = node.add(cfg, netns=node.pod())
    assert vf_of(res) == vf1
    # The pod's VF has carrier as ADD returns.
    assert "LOWER_UP" in (link("net1", os.path.basename(node.pods[0])) or {})["flags"]
    [record] = FileStore(node.data_dir).aside().values()
    assert (record.vf_pci, record.reason, record.failures) == (vf0, aside.NO_CARRIER, 1)
    assert "no carrier" in record.detail and record.retry_after >= record.last + aside.BACK_OFF
    # The broken VF is back in the host as it was: only the working one is held.
    assert link(node.pfs[0].vfs[0].netdev or "") is not None
    assert node.records() == [f"{vf1}.json"]
    shown = statuses(node)[vf0]
    assert shown["state"] == "set aside" and shown["setAside"]["failures"] == 1, shown

    # The next pod does not try the broken VF again (that would count a failure).
    res = node.add(cfg, netns=node.pod(), container="ctr2")
    assert vf_of(res) == vf2
    assert FileStore(node.data_dir).aside()[vf0].failures == 1


def test_a_vf_set_aside_is_tried_again_after_its_back_off_and_rejoins_the_pool_when_it_works(node: Node) -> None:
    broken_first(node, 2)
    vf0, vf1 = (vf.pci for vf in node.pfs[0].vfs)
    cfg = conf(node, cniVersion="1.1.0")
    assert vf_of(node.add(cfg, netns=node.pod())) == vf1
    store = FileStore(node.data_dir)

    # Within its back-off it is passed over, and "no free VF" says so.
    res = node.cni("ADD", cfg, netns=node.pod(), container="ctr2")
    assert res.rc != 0 and res.out["code"] == 101, res.stdout
    assert f"{vf0} (no carrier" in res.out["details"], res.out

    # Its back-off over and its link fixed, the next pod gets it.
    record = store.aside()[vf0]
    record.retry_after = time.time() - 1
    store.set_aside(record)
    node.vf_peer(0, "up")
    res = node.add(cfg, netns=node.pods[1], container="ctr2")
    assert vf_of(res) == vf0
    assert store.aside() == {}
    assert statuses(node)[vf0]["setAside"] is None


def test_a_vf_whose_link_another_tool_disabled_is_set_aside_at_once_and_left_disabled(node: Node) -> None:
    node.add_pf(2)
    vf0, vf1 = node.pfs[0].vfs
    node.vf_peer(1, "up")
    node.pf_carrier("1")
    node.fake.state[node.pfs[0].name][0]["link_state"] = vfsettings.LINK_STATE_DISABLE

    res = node.add(conf(node, cniVersion="1.1.0"), netns=node.pod())
    assert vf_of(res) == vf1.pci
    # Set aside for its link, without waiting for a carrier it cannot get.
    record = FileStore(node.data_dir).aside()[vf0.pci]
    assert record.reason == aside.LINK_DISABLED and "link_state disable" in record.detail
    # Never undone: no setting was written for VF 0.
    assert node.fake.state[node.pfs[0].name][0]["link_state"] == vfsettings.LINK_STATE_DISABLE
    assert [call for call in node.fake.calls if call[2] == 0] == []


def test_when_no_vf_comes_up_add_names_each_vf_tried_and_leaves_nothing(node: Node, tmp_path: Path) -> None:
    node.add_pf(3)
    node.pf_carrier("1")
    node.carrier_wait = 1.0
    # Room for two waits: the third VF is not tried.
    node.add_budget = 2.5
    pod = node.pod()
    before = node.picture()
    cfg = conf(node)
    res = node.cni("ADD", cfg, netns=pod)
    assert res.rc != 0 and res.out["code"] == 100, res.stdout
    vf0, vf1, vf2 = (vf.pci for vf in node.pfs[0].vfs)
    assert "no VF came up" in res.out["msg"], res.out
    assert f"VF {vf0}: VF {vf0} has no carrier" in res.out["details"] and f"VF {vf1}:" in res.out["details"]
    assert vf2 not in res.out["details"]
    assert sorted(FileStore(node.data_dir).aside()) == [vf0, vf1]
    assert node.picture() == before
    assert not any((node.ipam_dir / cfg["name"]).glob("10.*")), "the address was not released"


def test_a_vf_a_device_plugin_chose_is_only_tried_and_shown_set_aside(node: Node) -> None:
    broken_first(node, 2)
    vf0 = node.pfs[0].vfs[0].pci
    cfg = conf(node, deviceID=vf0)
    for failures in (1, 2):
        res = node.cni("ADD", cfg, netns=node.pod(), container=f"c{failures}")
        assert res.rc != 0 and "no carrier" in res.out["msg"], res.stdout
        assert FileStore(node.data_dir).aside()[vf0].failures == failures
    assert node.records() == []
    assert statuses(node)[vf0]["state"] == "set aside"
