"""What the DEL and GC tests share with the claims tests: a call that succeeded silently, a stale record."""

from __future__ import annotations

from typing import Any

from sriov_cni.kernel.vfsettings import PfSettings, Rate, Vlan
from sriov_cni.vfstore import Allocation, FileStore, OriginalState
from tests.support.pluginlib import DEBIAN_CNI_DIR, Node, Outcome, link


def ok(res: Outcome) -> None:
    assert res.rc == 0, res.stdout + res.stderr
    assert res.stdout == ""


def stale_record(
    node: Node, vf_index: int = 0, ipam_config: dict[str, Any] | None = None, **applied: Any
) -> Allocation:
    """A record of a container that died without DEL; its VF is in the host, dirty.

    ``ipam_config``: the network's config as its IPAM's DEL reads it, when
    the dead container had an address.
    """
    pf = node.pfs[0]
    vf = pf.vfs[vf_index]
    entry = link(str(vf.netdev))
    assert entry is not None
    alloc = Allocation(
        vf_pci=vf.pci,
        pf_pci=pf.pci,
        pf_netdev=pf.name,
        vf_index=vf_index,
        network="sriov-net",
        container_id="dead",
        ifname="net1",
        netns="/var/run/netns/svpod-long-gone",
        netns_inode=12345,
        original=OriginalState(
            pf=PfSettings(
                vlan=Vlan(0, 0, 0x8100),
                mac="00:00:00:00:00:00",
                rate=Rate(0, 0),
                spoofchk=True,
                trust=False,
                link_state=0,
            ),
            netdev=str(vf.netdev),
            mtu=entry["mtu"],
            mac=entry["address"],
            promisc=False,
            altnames=entry["altnames"],
            alias="",
        ),
        applied=PfSettings(**applied),
        in_pod=True,
        ipam_config=ipam_config,
        cni_path=DEBIAN_CNI_DIR,
    )
    FileStore(node.data_dir).put(alloc)
    return alloc
