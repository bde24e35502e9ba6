"""DPDK-bound VFs on the real igb driver (runs in the rig's QEMU guest).

``sriov-cni setup`` binds igb's VFs to uio_pci_generic, or to vfio-pci
behind the rig's emulated VT-d; the plugin then configures them from the PF
side only, and ``vfDriver: kernel`` gives them back to igbvf.  Effects are
read from sysfs, /dev and the PF's vfinfo_list.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.vm.nodecommand import Node
from tests.vm.plugincalls import cni, ns_path, records, restored, vfinfo
from tests.vm.vmlib import Sriov, ip_json, vf_pci_dirs

pytestmark = pytest.mark.sriov_vm


def drivers(pf: str) -> list[str]:
    return [(d / "driver").resolve().name for d in vf_pci_dirs(pf)]


def status_vfs(node: Node, pf: str) -> list[dict[str, Any]]:
    done = node.run("status", "--json", "--data-dir", str(node.data))
    assert done.returncode == 0, done.stderr
    [mine] = [p for p in json.loads(done.stdout)["pfs"] if p["netdev"] == pf]
    return list(mine["vfs"])


def conf(node: Node, **keys: Any) -> dict[str, Any]:
    ipam = {"type": "sriov-ipam", "dataDir": str(node.data / "ipam"), "ranges": [[{"subnet": "10.82.0.0/24"}]]}
    return {"cniVersion": "1.1.0", "name": "dpdknet", "type": "sriov", "dataDir": str(node.data), "ipam": ipam, **keys}


def device_node(vf: Path, driver: str) -> Path:
    """The character device a DPDK application opens for this VF."""
    if driver == "vfio-pci":
        return Path("/dev/vfio", (vf / "iommu_group").resolve().name)
    [uio] = list((vf / "uio").iterdir())
    return Path("/dev", uio.name)


@pytest.mark.parametrize("driver", ["uio_pci_generic", "vfio-pci"])
def test_dpdk_bound_vfs_configured_from_the_pf_side_then_rebound(
    driver: str, node: Node, igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str]
) -> None:
    pf = igb_pfs[0]
    done = node.setup(f"pfs: [{{pf: {pf}, numVfs: 2, vfDriver: {driver}}}]")
    assert done.returncode == 0, done.stdout + done.stderr
    dirs = vf_pci_dirs(pf)
    pci0, pci1 = (d.name for d in dirs)
    assert drivers(pf) == [driver, driver]
    for d in dirs:
        assert not (d / "net").exists()
        assert device_node(d, driver).exists()
    assert [(v["pci"], v["driver"], v["state"], v["netdev"]) for v in status_vfs(node, pf)] == [
        (pci0, driver, "free", None),
        (pci1, driver, "free", None),
    ]
    before = [vfinfo(pf, 0), vfinfo(pf, 1)]

    # The device plugin's choice, with every PF-side setting a DPDK NAD uses.
    pod0, pod1 = netns(), netns()
    mac = "02:dd:00:00:00:01"
    by_id = conf(node, deviceID=pci0, mac=mac, vlan=100, spoofchk="off")
    rc, res = cni("ADD", by_id, container="dpdk0", netns=ns_path(pod0))
    assert rc == 0, res
    assert res["interfaces"] == [{"name": "net1", "mac": mac, "sandbox": ns_path(pod0), "pciID": pci0}]
    assert res["ips"][0]["address"].startswith("10.82.0.")
    info = vfinfo(pf, 0)
    assert (info["address"], info["vlan_list"], info["spoofchk"]) == (mac, [{"vlan": 100}], False)
    assert [link["ifname"] for link in ip_json("link", "show", netns=pod0)] == ["lo"]
    assert drivers(pf) == [driver, driver]

    # Self-allocation counts the other DPDK-bound VF as free.
    pool = conf(node, pfNames=[pf], vlan=200)
    rc, res = cni("ADD", pool, container="dpdk1", netns=ns_path(pod1))
    assert rc == 0, res
    assert res["interfaces"][0]["pciID"] == pci1
    assert vfinfo(pf, 1)["vlan_list"] == [{"vlan": 200}]
    assert [v["state"] for v in status_vfs(node, pf)] == ["allocated", "allocated"]
    rc, res = cni("ADD", pool, container="dpdk2", netns=ns_path(netns()))
    assert rc != 0 and "no free VF" in res["msg"], res

    for container, pod, c in (("dpdk0", pod0, by_id), ("dpdk1", pod1, pool)):
        rc, res = cni("DEL", c, container=container, netns=ns_path(pod))
        assert rc == 0, res
    restored(vfinfo(pf, 0), before[0])
    restored(vfinfo(pf, 1), before[1])
    assert records(node.data) == []
    assert [v["state"] for v in status_vfs(node, pf)] == ["free", "free"]

    done = node.setup(f"pfs: [{{pf: {pf}, numVfs: 2}}]")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "VFs on kernel: 2 VFs rebound" in done.stdout
    assert drivers(pf) == ["igbvf", "igbvf"]
    assert all((d / "net").is_dir() and any((d / "net").iterdir()) for d in dirs)
