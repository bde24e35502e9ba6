"""Two VFs reused by pod after pod on the real igb/igbvf driver (runs in the rig's QEMU guest).

Traffic is the oracle: every round, the two pods ping each other both
ways.  A pod's config is drawn from what changes how a VF's MAC reaches the
PF's receive filter: a ``mac`` or none, ``trust`` on, off or unset, a VLAN
or none.  The first round runs on VFs nobody opened; the second repeats
its config on the same VFs, the case where every later pod had no traffic.
Real: the igb/igbvf drivers and their VFs, created by a plain
``sriov_numvfs`` write; the pods are network namespaces.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.vm.plugincalls import Pod, cni, conf, host_link, ns_path, ping, records, restored, vfinfo, view
from tests.vm.vmlib import Sriov

pytestmark = pytest.mark.sriov_vm


# (VLAN of both pods, pod A, pod B): two pods reach each other through igb
# only on the same VLAN.
ROUNDS: list[tuple[int | None, Pod, Pod]] = [
    (None, Pod(None, None), Pod(None, None)),
    (None, Pod(None, None), Pod(None, None)),
    (10, Pod("02:ab:00:00:00:01", "off"), Pod(None, "on")),
    (None, Pod(None, "off"), Pod("02:ab:00:00:00:02", None)),
    (10, Pod(None, None), Pod(None, "off")),
    (None, Pod("02:ab:00:00:00:03", "on"), Pod("02:ab:00:00:00:04", "off")),
    (None, Pod(None, "on"), Pod(None, None)),
]


def test_two_vfs_reused_by_seven_rounds_of_pods(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    pf = igb_pfs[0]
    vf_names = sriov.enable(pf, 2)
    before = [vfinfo(pf, i) for i in range(2)]
    netdevs_before = [view(host_link(name)) for name in vf_names]
    # Never had carrier: the first ADD opens and closes each in the host
    # once before its pod gets it (sriov_cni/kernel/firstopen.py).
    assert [int(Path(f"/sys/class/net/{name}/carrier_up_count").read_text()) for name in vf_names] == [0, 0]

    for n, (vlan, *plan) in enumerate(ROUNDS):
        pods, confs = [netns(), netns()], [conf(tmp_path, pf, vlan, p) for p in plan]
        addresses, macs, results = [], [], []
        for i, (pod, cfg) in enumerate(zip(pods, confs, strict=True)):
            rc, res = cni("ADD", cfg, container=f"r{n}p{i}", netns=ns_path(pod))
            assert rc == 0, (n, i, res)
            results.append(res)
            addresses.append(res["ips"][0]["address"].split("/")[0])
            macs.append(res["interfaces"][0]["mac"])
            inside = host_link("net1", pod)
            assert inside is not None and inside["address"] == macs[-1]
            if plan[i].mac:
                assert macs[-1] == plan[i].mac
        for pod in pods:
            sriov.wait_carrier("net1", pod)
        ping(pods[0], addresses[1])
        ping(pods[1], addresses[0])
        # What igb reports for a VF is its entry in the PF's receive filter:
        # each pod's MAC, on one VF each, with the round's VLAN.
        readings = sorted((vfinfo(pf, v)["address"], str(vfinfo(pf, v)["vlan_list"])) for v in range(2))
        assert readings == sorted((mac, str([{"vlan": vlan}] if vlan else [{}])) for mac in macs), n
        for i, (pod, cfg) in enumerate(zip(pods, confs, strict=True)):
            rc, res = cni("CHECK", dict(cfg, prevResult=results[i]), container=f"r{n}p{i}", netns=ns_path(pod))
            assert rc == 0, (n, i, res)

        for i, (pod, cfg) in enumerate(zip(pods, confs, strict=True)):
            rc, res = cni("DEL", cfg, container=f"r{n}p{i}", netns=ns_path(pod))
            assert rc == 0, (n, i, res)
        for i, name in enumerate(vf_names):
            restored(vfinfo(pf, i), before[i])
            assert view(host_link(name)) == netdevs_before[i]
    assert records(tmp_path) == []


def test_check_notices_a_vf_the_pf_holds_no_mac_for(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """The state every reused VF was attached in: its MAC gone from the PF's filter, so no traffic."""
    pf = igb_pfs[0]
    [vf0] = sriov.enable(pf, 1)
    before, netdev_before = vfinfo(pf, 0), view(host_link(vf0))
    pod = netns()
    cfg = conf(tmp_path, pf, None, Pod(None, None))
    rc, res = cni("ADD", cfg, container="c", netns=ns_path(pod))
    assert rc == 0, res
    sriov.wait_carrier("net1", pod)
    with_prev = dict(cfg, prevResult=res)
    rc, out = cni("CHECK", with_prev, container="c", netns=ns_path(pod))
    assert rc == 0, out

    subprocess.run(["ip", "link", "set", "dev", pf, "vf", "0", "mac", "00:00:00:00:00:00"], check=True)
    rc, out = cni("CHECK", with_prev, container="c", netns=ns_path(pod))
    assert rc != 0 and out["code"] == 100, out
    assert "00:00:00:00:00:00" in out["details"] and res["interfaces"][0]["mac"] in out["details"], out

    rc, out = cni("DEL", cfg, container="c", netns=ns_path(pod))
    assert rc == 0, out
    restored(vfinfo(pf, 0), before)
    assert view(host_link(vf0)) == netdev_before


def test_an_admin_mac_set_on_the_node_before_reaches_the_pod(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """No ``mac`` configured, but the node's admin set one for VF 0, which igbvf has not taken yet.

    igb refuses the VF's own MAC then; the VF takes the admin MAC when it
    resets, and that is the MAC the pod must get to have traffic.  VF 0 was
    opened on the host first: a new VF is not yet talking to the PF, and
    takes such an admin MAC only at its first reset, seconds after its
    first pod opened it.
    """
    pf = igb_pfs[0]
    vf_names = sriov.enable(pf, 2)
    admin = "02:ab:00:00:00:aa"
    for state in ("up", "down"):
        subprocess.run(["ip", "link", "set", "dev", vf_names[0], state], check=True)
    subprocess.run(["ip", "link", "set", "dev", pf, "vf", "0", "mac", admin], check=True)
    before = [vfinfo(pf, i) for i in range(2)]
    netdevs_before = [view(host_link(name)) for name in vf_names]
    assert before[0]["address"] == admin and netdevs_before[0] is not None
    assert netdevs_before[0]["address"] != admin

    for n in range(2):
        pods = [netns(), netns()]
        cfg = conf(tmp_path, pf, None, Pod(None, None))
        results = []
        for i, pod in enumerate(pods):
            rc, res = cni("ADD", cfg, container=f"a{n}p{i}", netns=ns_path(pod))
            assert rc == 0, (n, i, res)
            results.append(res)
        # The pod on VF 0 has the admin MAC, in the pod as in the result.
        macs = [res["interfaces"][0]["mac"] for res in results]
        assert admin in macs and [host_link("net1", pod)["address"] for pod in pods] == macs  # type: ignore[index]
        for pod in pods:
            sriov.wait_carrier("net1", pod)
        ping(pods[0], results[1]["ips"][0]["address"].split("/")[0])
        ping(pods[1], results[0]["ips"][0]["address"].split("/")[0])
        for i, pod in enumerate(pods):
            rc, res = cni("DEL", cfg, container=f"a{n}p{i}", netns=ns_path(pod))
            assert rc == 0, (n, i, res)
        assert [vfinfo(pf, i) for i in range(2)] == before
    assert records(tmp_path) == []
