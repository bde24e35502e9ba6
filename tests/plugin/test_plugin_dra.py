"""The calls a DRA driver makes (dra-driver-sriov), and the device-info file of each attachment.

STANDALONE mode: the driver calls the plugin itself through libcni, with the
NAD's config plus a top-level ``deviceID``, the kubelet-style CNI_ARGS, no
runtimeConfig, an ifname from the claim, and DEL possibly repeated.
MULTUS mode: Multus passes the VF as ``runtimeConfig.deviceID`` and the
device-info file it copied from the driver's as
``runtimeConfig.CNIDeviceInfoFile``.

Real: veth ends as VFs moved into real pod namespaces (checked with ``ip``),
files on disk; the fixture: sysfs is a temporary tree, the PF side is in
memory.  The igb guest runs the same calls through the shim and the daemon
(tests/vm/test_shim_igb.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.support.pluginlib import Node, addresses, ipam_reservations, link, link_names

# What the DRA driver sends besides the config: kubelet's keys, as libcni gets them.
DRA_ARGS = (
    "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-a;"
    "K8S_POD_INFRA_CONTAINER_ID=0a1b2c3d;K8S_POD_UID=8c4e5f2a-0f0e-4c1d-9d1e-2f3a4b5c6d7e"
)


def claim_status(result: dict[str, Any]) -> dict[str, Any]:
    """What the DRA driver copies into the ResourceClaim's status: the pod-side interface, and every IP."""
    [iface] = [i for i in result["interfaces"] if i.get("sandbox")]
    return {"interface": iface["name"], "mac": iface["mac"], "ips": [ip["address"] for ip in result["ips"]]}


def test_standalone_call_attaches_the_named_vf_and_a_repeated_del_succeeds(node: Node) -> None:
    pf = node.add_pf(3)
    vf = pf.vfs[1]
    pod = node.pod()
    before = node.picture()
    conf = node.conf("1.1.0", deviceID=vf.pci, ipam=node.sriov_ipam("10.44.0.0/24"))
    res = node.add(conf, netns=pod, container="0a1b2c3d", ifname="vfnet0", args=DRA_ARGS)

    pod_link = link("vfnet0", os.path.basename(pod))
    assert pod_link is not None and vf.netdev not in link_names()
    assert claim_status(res.out) == {"interface": "vfnet0", "mac": pod_link["address"], "ips": ["10.44.0.2/24"]}
    assert res.out["interfaces"][0]["pciID"] == vf.pci
    assert addresses("vfnet0", os.path.basename(pod)) == {"10.44.0.2/24"}
    for _ in range(2):
        done = node.cni("DEL", conf, netns=pod, container="0a1b2c3d", ifname="vfnet0", args=DRA_ARGS)
        assert (done.rc, done.stdout) == (0, "")
    assert node.picture() == before


def test_a_del_after_the_netns_went_and_the_drivers_retry_without_one_succeed(node: Node) -> None:
    # The driver's DEL can come after the pod's namespace was removed; on
    # "failed to open netns" it retries with an empty CNI_NETNS.  A DPDK VF
    # here: a veth, unlike a VF's netdev, dies with the namespace (the igb
    # guest's test_pod_netns_deleted_before_del has a netdev come back).
    pf = node.add_pf(1, dpdk=(0,))
    pod = node.pod()
    before = node.picture()
    conf = node.conf("1.1.0", deviceID=pf.vfs[0].pci, ipam=node.sriov_ipam("10.46.0.0/24"))
    node.add(conf, netns=pod, container="0a1b2c3d", ifname="vfnet0", args=DRA_ARGS)
    subprocess.run(["ip", "netns", "del", os.path.basename(pod)], check=True)
    node.pods.remove(pod)
    for netns in (pod, ""):
        done = node.cni("DEL", conf, netns=netns, container="0a1b2c3d", ifname="vfnet0", args=DRA_ARGS)
        assert (done.rc, done.stdout) == (0, "")
    assert {k: v for k, v in node.picture().items() if k != "pods"} == {k: v for k, v in before.items() if k != "pods"}
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_a_vf_named_by_device_id_is_never_self_allocated(node: Node) -> None:
    pf = node.add_pf(1)
    node.add(node.conf("1.1.0", deviceID=pf.vfs[0].pci), netns=node.pod(), container="dra", ifname="vfnet0")
    res = node.cni("ADD", node.conf("1.1.0", pfNames=[pf.name]), netns=node.pod(), container="pool")
    assert res.rc != 0 and res.code == 101
    assert res.out["msg"] == "no free VF in the pool (1 VFs, all taken)"
    assert f"{pf.vfs[0].pci} (container dra, netns {node.pods[0]})" in res.out["details"]


def test_a_device_id_held_by_another_attachment_is_refused_naming_the_holder(node: Node) -> None:
    pf = node.add_pf(2)
    conf = node.conf("1.1.0", deviceID=pf.vfs[0].pci)
    node.add(conf, netns=node.pod(), container="first", ifname="vfnet0", args=DRA_ARGS)
    second = node.pod()
    before = node.picture()
    res = node.cni("ADD", conf, netns=second, container="second", ifname="vfnet0", args=DRA_ARGS)
    assert res.rc == 1 and res.code == 101
    assert res.out["msg"] == f"VF {pf.vfs[0].pci} (container first, netns {node.pods[0]}) is not free"
    assert node.picture() == before


def _devinfo_path(node: Node, name: str) -> Path:
    # Under the data directory's parent: the spec's /var/run/k8s.cni.cncf.io/devinfo/cni, in this test's tree.
    return node.data_dir.parent / "k8s.cni.cncf.io" / "devinfo" / "cni" / name


def test_multus_mode_keeps_the_drivers_file_adds_the_pf_and_leaves_it_to_multus(node: Node) -> None:
    pf = node.add_pf(2)
    vf = pf.vfs[1]
    path = _devinfo_path(node, f"sriov-net-ctr_net1-{node.token}")
    path.parent.mkdir(parents=True)
    # What the DRA driver wrote and Multus copied: no PF address.
    path.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": vf.pci}}))
    conf = node.conf("1.1.0", runtimeConfig={"deviceID": vf.pci, "CNIDeviceInfoFile": str(path)})
    pod = node.pod()
    res = node.add(conf, netns=pod, container="ctr")
    assert res.out["interfaces"][0]["pciID"] == vf.pci
    assert json.loads(path.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": vf.pci, "pf-pci-address": pf.pci},
    }
    assert node.cni("DEL", conf, netns=pod, container="ctr").rc == 0
    # Multus removes its copy after DEL; the plugin did not create it.
    assert path.exists()


def test_a_self_allocated_vf_gets_a_file_its_del_removes(node: Node) -> None:
    pf = node.add_pf(2)
    (node.sys / "bus" / "pci" / "devices" / pf.vfs[0].pci / "infiniband" / "mlx5_4").mkdir(parents=True)
    path = _devinfo_path(node, "sriov-net-ctr_net1")
    # The fixture's RDMA device is a directory, not a device the kernel can
    # move: this network leaves it where it is (tests/plugin/test_plugin_rdma.py
    # covers the moves).
    conf = node.conf("1.1.0", rdma="off", runtimeConfig={"CNIDeviceInfoFile": str(path)})
    pod = node.pod()
    node.add(conf, netns=pod, container="ctr")
    # The directory did not exist: the plugin created it.
    assert json.loads(path.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": pf.vfs[0].pci, "pf-pci-address": pf.pci, "rdma-device": "mlx5_4"},
    }
    assert node.cni("DEL", conf, netns=pod, container="ctr").rc == 0
    assert not path.exists()


def test_a_dpdk_vf_gets_a_file_too(node: Node) -> None:
    pf = node.add_pf(2, dpdk=(1,))
    path = _devinfo_path(node, "dpdk")
    conf = node.conf("1.1.0", runtimeConfig={"deviceID": pf.vfs[1].pci, "CNIDeviceInfoFile": str(path)})
    res = node.add(conf, netns=node.pod(), container="ctr", ifname="vfnet0")
    assert res.out["interfaces"][0]["pciID"] == pf.vfs[1].pci
    assert json.loads(path.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": pf.vfs[1].pci, "pf-pci-address": pf.pci},
    }


def test_a_file_naming_another_vf_fails_the_add_and_changes_nothing(node: Node) -> None:
    pf = node.add_pf(2)
    path = _devinfo_path(node, "other")
    path.parent.mkdir(parents=True)
    other = json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": pf.vfs[0].pci}})
    path.write_text(other)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(
        "1.1.0",
        runtimeConfig={"deviceID": pf.vfs[1].pci, "CNIDeviceInfoFile": str(path)},
        ipam=node.sriov_ipam("10.45.0.0/24"),
    )
    res = node.cni("ADD", conf, netns=pod, container="ctr")
    assert res.rc == 1 and res.code == 7
    assert res.out["msg"] == (
        f"device-info file {path} names PCI device '{pf.vfs[0].pci}', not this attachment's VF {pf.vfs[1].pci}"
    )
    assert node.picture() == before and path.read_text() == other
    # IPAM had run (the file is written last) and gave its address back.
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_device_info_file_must_be_an_absolute_path(node: Node) -> None:
    node.add_pf(1)
    res = node.cni("ADD", node.conf("1.1.0", runtimeConfig={"CNIDeviceInfoFile": "devinfo.json"}), netns=node.pod())
    assert res.rc == 1 and res.code == 7
    assert res.out["msg"] == 'runtimeConfig.CNIDeviceInfoFile "devinfo.json" must be an absolute path'
