"""A VF's MAC across pods on the real igb/igbvf driver (runs in the rig's QEMU guest).

igb reports in the PF's IFLA_VF_MAC both an administrative MAC and a MAC
the VF programmed itself, and refuses a VF's own MAC change while an admin
MAC is set.  igbvf adopts an admin MAC only when it resets.  A VF not opened
since probe behaves differently from one that has been, so every test here
reuses one VF across several pods, with ``mac`` set the way NADs set it:
without ``trust``, or with ``trust: off``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.vm.plugincalls import cni, host_link, ns_path, ping, records, restored, vfinfo, view
from tests.vm.vmlib import Sriov, vf_pci_dirs

pytestmark = pytest.mark.sriov_vm

MACS = [f"02:aa:00:00:00:0{i}" for i in range(1, 6)]


def vf_conf(data_dir: Path, pci: str, **keys: Any) -> dict[str, Any]:
    ipam = {"type": "sriov-ipam", "dataDir": str(data_dir / "ipam"), "ranges": [[{"subnet": "10.81.0.0/24"}]]}
    return {
        "cniVersion": "1.0.0",
        "name": "macnet",
        "type": "sriov",
        "deviceID": pci,
        "dataDir": str(data_dir),
        "ipam": ipam,
        **keys,
    }


def pod_mac(pod: str) -> str:
    inside = host_link("net1", pod)
    assert inside is not None and "UP" in inside["flags"], inside
    return str(inside["address"])


def test_five_pods_with_their_own_mac_on_one_vf(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """trust unset: each pod gets its MAC and traffic; the PF side ends as it began."""
    pf = igb_pfs[0]
    vf0, _ = sriov.enable(pf, 2)
    pci0, pci1 = (d.name for d in vf_pci_dirs(pf))
    info_before, netdev_before = vfinfo(pf, 0), view(host_link(vf0))
    peer = netns()
    rc, res = cni("ADD", vf_conf(tmp_path, pci1), container="peer", netns=ns_path(peer))
    assert rc == 0, res
    peer_ip = res["ips"][0]["address"].split("/")[0]
    sriov.wait_carrier("net1", peer)

    for n, mac in enumerate(MACS):
        pod = netns()
        conf = vf_conf(tmp_path, pci0, mac=mac)
        rc, res = cni("ADD", conf, container=f"pod{n}", netns=ns_path(pod))
        assert rc == 0, (n, res)
        assert res["interfaces"][0]["mac"] == mac
        assert pod_mac(pod) == mac
        assert vfinfo(pf, 0)["address"] == mac
        sriov.wait_carrier("net1", pod)
        ping(pod, peer_ip)

        rc, res = cni("DEL", conf, container=f"pod{n}", netns=ns_path(pod))
        assert rc == 0, (n, res)
        restored(vfinfo(pf, 0), info_before)
        assert view(host_link(vf0)) == netdev_before

    rc, res = cni("DEL", vf_conf(tmp_path, pci1), container="peer", netns=ns_path(peer))
    assert rc == 0, res
    assert records(tmp_path) == []


def test_trust_off_and_pods_without_mac_in_turn(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """A pod without ``mac`` (igbvf programs its own MAC at the PF) and ``trust: off`` pods alternate."""
    pf = igb_pfs[0]
    [vf0] = sriov.enable(pf, 1)
    pci = vf_pci_dirs(pf)[0].name
    info_before, netdev_before = vfinfo(pf, 0), view(host_link(vf0))
    assert netdev_before is not None
    plan: list[str | None] = [None, MACS[0], None, MACS[1], MACS[2], None]
    for n, mac in enumerate(plan):
        pod = netns()
        conf = vf_conf(tmp_path, pci, trust="off", **({"mac": mac} if mac else {}))
        rc, res = cni("ADD", conf, container=f"pod{n}", netns=ns_path(pod))
        assert rc == 0, (n, res)
        assert pod_mac(pod) == (mac or netdev_before["address"])
        assert vfinfo(pf, 0)["trust"] is False

        rc, res = cni("DEL", conf, container=f"pod{n}", netns=ns_path(pod))
        assert rc == 0, (n, res)
        restored(vfinfo(pf, 0), info_before)
        assert view(host_link(vf0)) == netdev_before
    assert records(tmp_path) == []


def test_a_mac_the_vf_chose_itself_is_not_locked(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """A VF that was opened on the host before: igb reports its own MAC, which is no admin MAC.

    Writing that reading back as an admin MAC would make igb refuse every
    later change the VF asks for, on the host as in the next pod.
    """
    pf = igb_pfs[0]
    [vf0] = sriov.enable(pf, 1)
    pci = vf_pci_dirs(pf)[0].name
    subprocess.run(["ip", "link", "set", "dev", vf0, "address", "02:bb:00:00:00:01"], check=True)
    subprocess.run(["ip", "link", "set", "dev", vf0, "up"], check=True)
    subprocess.run(["ip", "link", "set", "dev", vf0, "down"], check=True)
    info_before, netdev_before = vfinfo(pf, 0), view(host_link(vf0))
    assert info_before["address"] == "02:bb:00:00:00:01"

    for n, mac in enumerate(MACS[:2]):
        pod = netns()
        conf = vf_conf(tmp_path, pci, mac=mac)
        rc, res = cni("ADD", conf, container=f"pod{n}", netns=ns_path(pod))
        assert rc == 0, (n, res)
        assert pod_mac(pod) == mac
        rc, res = cni("DEL", conf, container=f"pod{n}", netns=ns_path(pod))
        assert rc == 0, (n, res)
        restored(vfinfo(pf, 0), info_before)
        assert view(host_link(vf0)) == netdev_before

    subprocess.run(["ip", "link", "set", "dev", vf0, "address", "02:bb:00:00:00:02"], check=True)
    assert vfinfo(pf, 0)["address"] == "02:bb:00:00:00:02"
