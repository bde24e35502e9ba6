"""Device information files: the spec's layout (Device Information Spec 1.1.0), read, merged, written, removed.

Real: files in a temporary directory, the sysfs layout of an RDMA VF in a
temporary tree (no emulated NIC has one).  The spec's examples are written
here as fixtures from its field list: a PCI device with ``pf-pci-address``,
one with ``vhost-net``, a vDPA and a vhost-user device.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from sriov_cni import deviceinfo
from sriov_cni.cni import CNIError, Code
from tests.support.nodetree import Tree

# The spec's section 4.3 and 6.1.2 examples.
SPEC_PCI = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:01:02.2", "pf-pci-address": "0000:01:02.0"}}
SPEC_VHOST_NET = {
    "type": "pci",
    "version": "1.1.0",
    "pci": {"pci-address": "0000:18:0a.2", "vhost-net": "/dev/vhost-net", "pf-pci-address": "0000:18:00.1"},
}
SPEC_VDPA = {
    "type": "vdpa",
    "version": "1.1.0",
    "vdpa": {"parent-device": "vdpa3", "driver": "vhost", "path": "/dev/vdpa-vhost0"},
}
SPEC_VHOST_USER = {
    "type": "vhost-user",
    "version": "1.1.0",
    "vhost-user": {"mode": "server", "path": "/var/run/vhost.sock"},
}
# What sriov-network-device-plugin writes for an RDMA VF: no PF address.
DEVICE_PLUGIN_RDMA = {
    "type": "pci",
    "version": "1.0.0",
    "pci": {"pci-address": "0000:01:10.1", "rdma-device": "mlx5_7"},
}


@pytest.fixture
def igb(tree: Tree) -> Tree:
    tree.igb(vfs=2)
    return tree


def test_facts_of_a_vf_are_the_spec_layout(igb: Tree) -> None:
    assert deviceinfo.facts(igb.sys, "0000:01:10.0", "0000:01:00.0") == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": "0000:01:10.0", "pf-pci-address": "0000:01:00.0"},
    }
    # The keys and their nesting are the spec's example's, with values of this node.
    assert set(deviceinfo.facts(igb.sys, "0000:01:10.0", "0000:01:00.0")["pci"]) == set(SPEC_PCI["pci"])


def test_rdma_device_is_the_one_the_vf_lists_or_the_one_its_pod_holds(igb: Tree) -> None:
    def told(held: str | None = None) -> object:
        return deviceinfo.facts(igb.sys, "0000:01:10.1", "0000:01:00.0", held)["pci"].get("rdma-device")

    assert told() is None
    igb.rdma("0000:01:10.1", "mlx5_3")
    assert told() == "mlx5_3"
    # A Soft-RoCE device made in the pod has no PCI parent: the record names it.
    assert told("rxe_0000_01_10_1") == "rxe_0000_01_10_1"
    # Two listed: which one the pod uses cannot be told, so neither is named.
    igb.rdma("0000:01:10.1", "mlx5_4")
    assert told() is None


def _file(tmp_path: Path, content: Any) -> str:
    path = tmp_path / "devinfo.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_a_missing_file_reads_as_none_and_ours_is_written(tmp_path: Path) -> None:
    path = str(tmp_path / "none.json")
    ours = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:01:02.2", "pf-pci-address": "0000:01:02.0"}}
    assert deviceinfo.read(path) is None
    assert deviceinfo.merged(path, None, ours) == ours == SPEC_PCI


@pytest.mark.parametrize("spec", [SPEC_PCI, SPEC_VHOST_NET], ids=["pf-pci-address", "vhost-net"])
def test_what_the_spec_examples_say_is_kept(tmp_path: Path, spec: dict[str, Any]) -> None:
    path = _file(tmp_path, spec)
    pci = spec["pci"]["pci-address"]
    ours = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": pci, "pf-pci-address": "0000:ff:00.0"}}
    # The writer's PF address wins over ours; nothing it said is dropped.
    assert deviceinfo.merged(path, deviceinfo.read(path), ours) == spec


def test_a_device_plugin_file_gets_the_pf_address_added(tmp_path: Path) -> None:
    path = _file(tmp_path, DEVICE_PLUGIN_RDMA)
    ours = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:01:10.1", "pf-pci-address": "0000:01:00.0"}}
    assert deviceinfo.merged(path, deviceinfo.read(path), ours) == {
        "type": "pci",
        "version": "1.0.0",
        "pci": {"pci-address": "0000:01:10.1", "rdma-device": "mlx5_7", "pf-pci-address": "0000:01:00.0"},
    }


@pytest.mark.parametrize("spec", [SPEC_VDPA, SPEC_VHOST_USER], ids=["vdpa", "vhost-user"])
def test_a_file_of_another_type_is_kept_as_it_is(tmp_path: Path, spec: dict[str, Any]) -> None:
    path = _file(tmp_path, spec)
    ours = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:01:10.1", "pf-pci-address": "0000:01:00.0"}}
    assert deviceinfo.merged(path, deviceinfo.read(path), ours) == spec


def test_a_file_naming_another_vf_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, SPEC_PCI)
    ours = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:01:10.1", "pf-pci-address": "0000:01:00.0"}}
    with pytest.raises(CNIError) as err:
        deviceinfo.merged(path, deviceinfo.read(path), ours)
    assert err.value.code == Code.INVALID_CONFIG
    assert err.value.msg == (
        f"device-info file {path} names PCI device '0000:01:02.2', not this attachment's VF 0000:01:10.1"
    )


@pytest.mark.parametrize(
    "content, why",
    [
        ("{", "is not JSON"),
        ("[]", 'is not a device information object (no string "type")'),
        ('{"version": "1.1.0"}', 'is not a device information object (no string "type")'),
    ],
)
def test_an_unreadable_file_is_refused(tmp_path: Path, content: str, why: str) -> None:
    path = _file(tmp_path, content)
    with pytest.raises(CNIError) as err:
        deviceinfo.read(path)
    assert err.value.code == Code.INVALID_CONFIG and err.value.msg.startswith(f"device-info file {path} {why}")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    with pytest.raises(CNIError) as err:
        deviceinfo.read(str(path))
    assert "cannot be read" in err.value.msg


def test_write_creates_the_directory_and_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "var" / "run" / "k8s.cni.cncf.io" / "devinfo" / "cni" / "net-ctr_vfnet0"
    deviceinfo.write(str(path), SPEC_PCI)
    assert json.loads(path.read_text()) == SPEC_PCI
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    inode = path.stat().st_ino
    deviceinfo.write(str(path), SPEC_VHOST_NET)
    # Renamed over, not rewritten: a reader holding the old file never sees a mix.
    assert path.stat().st_ino != inode and json.loads(path.read_text()) == SPEC_VHOST_NET
    assert os.listdir(path.parent) == [path.name]


def test_write_refused_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CNIError) as err:
        deviceinfo.write(str(blocker / "devinfo.json"), SPEC_PCI)
    assert err.value.code == Code.IO_FAILURE and str(blocker / "devinfo.json") in err.value.msg


def test_remove_tolerates_a_file_already_gone(tmp_path: Path) -> None:
    path = _file(tmp_path, SPEC_PCI)
    deviceinfo.remove(path)
    assert not os.path.exists(path)
    deviceinfo.remove(path)
