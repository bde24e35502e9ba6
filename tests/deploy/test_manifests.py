"""The manifests in deploy/, checked offline as an API server would check
them, for every Kubernetes version the README claims, and what they embed
(the node config, the NADs' CNI configs) read by the code that reads it on a
node.

kubernetes-validate carries the API's JSON schemas; strict mode refuses
fields the API does not know, which a server silently drops (a misspelt
mountPropagation would deploy, without propagation). It has no schema for
NetworkAttachmentDefinition, a CRD: the NADs' configs go through the
plugin's own config parser instead, as the daemon would parse them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

import sriov_cni
from sriov_cni import cli
from sriov_cni.cni import CmdArgs
from sriov_cni.node import config as node_config
from sriov_cni.paths import Paths
from sriov_cni.plugin import config as plugin_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
NAD_KIND = ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")


def claimed_versions() -> list[str]:
    """The minor versions of "Kubernetes 1.A to 1.B" in the README."""
    m = re.search(r"Kubernetes 1\.(\d+) to 1\.(\d+)", (REPO / "README.md").read_text())
    assert m, "README.md claims no range of Kubernetes versions"
    return [f"1.{minor}" for minor in range(int(m[1]), int(m[2]) + 1)]


def resources() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object in deploy/kubernetes/: YAML documents with a kind."""
    found = []
    for path in sorted((DEPLOY / "kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "kind" in doc:
                found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


RESOURCES = resources()
API_RESOURCES = [(n, d) for n, d in RESOURCES if (d["apiVersion"], d["kind"]) != NAD_KIND]
NADS = [(n, d) for n, d in RESOURCES if (d["apiVersion"], d["kind"]) == NAD_KIND]


def test_every_manifest_is_found() -> None:
    kinds = sorted(d["kind"] for _, d in RESOURCES)
    assert kinds == ["ConfigMap", "DaemonSet"] + [NAD_KIND[1]] * 3


@pytest.mark.parametrize("version", claimed_versions())
@pytest.mark.parametrize("name,doc", API_RESOURCES, ids=[n for n, _ in API_RESOURCES])
def test_manifest_is_valid_for_claimed_versions(version: str, name: str, doc: dict[str, Any]) -> None:
    # Raises on a schema violation, an unknown field, a kind without a schema
    # or a version the package does not cover.
    kubernetes_validate.validate(doc, f"{version}.0", strict=True)


def daemonset() -> dict[str, Any]:
    (doc,) = [d for _, d in RESOURCES if d["kind"] == "DaemonSet"]
    return doc


def test_images_are_fully_qualified_and_the_build_default() -> None:
    # deploy/image/build-image.sh tags localhost/sriov-cni:VERSION; containerd would
    # read a short name as docker.io/library/sriov-cni and pull it.
    pod = daemonset()["spec"]["template"]["spec"]
    images = {c["image"] for c in pod["initContainers"] + pod["containers"]}
    assert images == {f"localhost/sriov-cni:{sriov_cni.__version__}"}


def test_configmap_node_config_parses() -> None:
    (cm,) = [d for _, d in RESOURCES if d["kind"] == "ConfigMap"]
    pod = daemonset()["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    (setup,) = [c for c in pod["initContainers"] if c["name"] == "setup"]
    (mount,) = [m for m in setup["volumeMounts"] if m["name"] == volume["name"]]
    # setup reads the file the ConfigMap's key becomes under its mount.
    path = Path(setup["command"][setup["command"].index("--config") + 1])
    assert path.parent == Path(mount["mountPath"])
    assert node_config.parse(cm["data"][path.name]).pfs


def test_setup_writes_the_rdma_boot_option_on_the_node_and_lets_the_daemon_start() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    (setup,) = [c for c in pod["initContainers"] if c["name"] == "setup"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in setup["volumeMounts"]}
    # Written into the container's own /etc, the option would never reach a boot.
    assert volumes[mounts[str(Paths.modprobe_dir)]]["hostPath"]["path"] == "/etc/modprobe.d"
    # Parsed as sriov-cni parses it: an option setup lacks fails here.
    assert setup["command"][:2] == ["sriov-cni", "setup"]
    params = cli.setup.make_context("setup", setup["command"][2:]).params
    assert params["allow_deferred"] is True


@pytest.mark.parametrize("name,doc", NADS, ids=[n for n, _ in NADS])
def test_nad_config_parses(name: str, doc: dict[str, Any]) -> None:
    assert set(doc["spec"]) == {"config"}
    conf = json.loads(doc["spec"]["config"])
    assert conf["name"] == doc["metadata"]["name"]
    assert conf["type"] == "sriov"
    if "k8s.v1.cni.cncf.io/resourceName" in doc["metadata"].get("annotations", {}):
        # Multus passes the device plugin's VF as runtimeConfig.deviceID.
        conf["runtimeConfig"] = {"deviceID": "0000:03:10.0"}
    cmd = CmdArgs(
        command="ADD",
        container_id="c",
        netns="/var/run/netns/pod",
        ifname="net1",
        args={},
        path=(),
        stdin=json.dumps(conf).encode(),
        conf=conf,
        cni_version=conf["cniVersion"],
        env={},
    )
    # No notes: no key is ignored for another or read under another name.
    assert plugin_config.load(cmd).notes == ()


def _node_config_pfs() -> dict[str, int]:
    """The PFs the shipped node configs set up (the DaemonSet's ConfigMap, the example), and their VF counts."""
    (cm,) = [d for _, d in RESOURCES if d["kind"] == "ConfigMap"]
    texts = [*cm["data"].values(), (DEPLOY / "systemd" / "node-config.example.yaml").read_text()]
    return {spec.pf: spec.num_vfs for text in texts for spec in node_config.parse(text).pfs}


@pytest.mark.parametrize("name,doc", NADS, ids=[n for n, _ in NADS])
def test_a_nads_pool_is_one_the_shipped_node_configs_create(name: str, doc: dict[str, Any]) -> None:
    conf = json.loads(doc["spec"]["config"])
    pfs = _node_config_pfs()
    for entry in conf.get("pfNames", []):
        pf, _, indexes = entry.partition("#")
        assert pf in pfs, f"{name} allocates from {pf}, which no shipped node config sets up ({sorted(pfs)})"
        last = max(int(part.split("-")[-1]) for part in indexes.split(",")) if indexes else 0
        assert last < pfs[pf], f"{name}: {entry} names VF {last}, beyond the {pfs[pf]} VFs of {pf}"
    # A network any number of pods may use fixes neither a MAC nor an address.
    assert "mac" not in conf and conf.get("ipam", {}).get("type") != "static", name
