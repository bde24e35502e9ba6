"""The manifests in deploy/kubernetes/, rendered by a real kustomize (the one
in the pinned kubectl, tests/deploy/kube.py) as `kubectl apply -k` renders
them, checked offline as an API server would check them for every
Kubernetes version the README claims, and what they embed (the node
configs, the NADs' CNI configs, the device plugin's config) read by the code
that reads it on a node.

kubernetes-validate carries the API's JSON schemas; strict mode refuses
fields the API does not know, which a server silently drops (a misspelt
mountPropagation would deploy, without propagation). It has no schema for
NetworkAttachmentDefinition, a CRD: the NADs' configs go through the
plugin's own config parser instead, as the daemon would parse them.
No cluster: what a server adds (admission, defaults, the CRD's own schema)
is not checked here; tests/vm/test_kubernetes_igb.py runs the DaemonSet's
pod on a node.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

import sriov_cni
from sriov_cni import cli
from sriov_cni.node import config as node_config
from sriov_cni.paths import Paths
from tests.deploy.kube import KUBERNETES, REPO, kustomizations, nad_notes, render

EXAMPLES = KUBERNETES / "examples"
NAD_KIND = ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition")
NAMESPACE = "kube-system"
KUSTOMIZATIONS = kustomizations()
IDS = [p.relative_to(KUBERNETES).as_posix() for p in KUSTOMIZATIONS]
# The node paths of the CNI plugins and their configs, as each cluster's
# runtime and Multus use them.
CNI_DIRS = {
    "base": ("/opt/cni/bin", "/etc/cni/net.d"),
    "overlays/k3s": ("/var/lib/rancher/k3s/data/current/bin", "/var/lib/rancher/k3s/agent/etc/cni/net.d"),
    "overlays/openshift": ("/var/lib/cni/bin", "/etc/kubernetes/cni/net.d"),
    "overlays/pool-example": ("/opt/cni/bin", "/etc/cni/net.d"),
}


def claimed_versions() -> list[str]:
    """The minor versions of "Kubernetes 1.A to 1.B" in the README."""
    m = re.search(r"Kubernetes 1\.(\d+) to 1\.(\d+)", (REPO / "README.md").read_text())
    assert m, "README.md claims no range of Kubernetes versions"
    return [f"1.{minor}" for minor in range(int(m[1]), int(m[2]) + 1)]


@functools.cache
def rendered(directory: Path) -> tuple[dict[str, Any], ...]:
    return tuple(render(directory))


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def example_docs() -> list[tuple[str, dict[str, Any]]]:
    """Every object of deploy/kubernetes/examples/, named file:kind/name."""
    found = []
    for path in sorted(EXAMPLES.iterdir()):
        for doc in yaml.safe_load_all(path.read_text()):
            found.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


EXAMPLE_DOCS = example_docs()
API_EXAMPLES = [(n, d) for n, d in EXAMPLE_DOCS if (d["apiVersion"], d["kind"]) != NAD_KIND]
NADS = [(n, d) for n, d in EXAMPLE_DOCS if (d["apiVersion"], d["kind"]) == NAD_KIND]


def test_every_overlay_is_one_whose_cni_directories_are_known() -> None:
    assert set(IDS) == set(CNI_DIRS)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_a_kustomization_renders_the_daemonset_and_its_node_config(directory: Path) -> None:
    docs = rendered(directory)
    kinds = sorted(d["kind"] for d in docs)
    extra = ["RoleBinding", "ServiceAccount"] if directory.name == "openshift" else []
    assert kinds == sorted(["ConfigMap", "DaemonSet", *extra])
    # The namespace is set once; nothing lands in the user's current one.
    assert {d["metadata"].get("namespace") for d in docs} == {NAMESPACE}


@pytest.mark.parametrize("version", claimed_versions())
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_rendered_objects_are_valid_for_claimed_versions(version: str, directory: Path) -> None:
    for doc in rendered(directory):
        # Raises on a schema violation, an unknown field, a kind without a
        # schema or a version the package does not cover.
        kubernetes_validate.validate(doc, f"{version}.0", strict=True)


@pytest.mark.parametrize("version", claimed_versions())
@pytest.mark.parametrize("name,doc", API_EXAMPLES, ids=[n for n, _ in API_EXAMPLES])
def test_example_is_valid_for_claimed_versions(version: str, name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, f"{version}.0", strict=True)


def test_examples_folder_holds_only_kubernetes_objects() -> None:
    # `kubectl apply -f deploy/kubernetes/examples/` reads every file there.
    files = sorted(p.name for p in EXAMPLES.iterdir())
    assert all(name.endswith(".yaml") for name in files), files
    assert {n.split(":")[0] for n, _ in EXAMPLE_DOCS} == set(files)


def pod_spec(directory: Path) -> dict[str, Any]:
    (ds,) = of_kind(rendered(directory), "DaemonSet")
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name]
    (one,) = found
    return one


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_images_are_fully_qualified_and_the_build_default(directory: Path) -> None:
    # deploy/image/build-image.sh tags localhost/sriov-cni:VERSION; containerd would
    # read a short name as docker.io/library/sriov-cni and pull it.
    pod = pod_spec(directory)
    images = {c["image"] for c in pod["initContainers"] + pod["containers"]}
    assert images == {f"localhost/sriov-cni:{sriov_cni.__version__}"}


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_configmap_node_config_parses(directory: Path) -> None:
    (cm,) = of_kind(rendered(directory), "ConfigMap")
    pod = pod_spec(directory)
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    setup = container(pod, "setup")
    (mount,) = [m for m in setup["volumeMounts"] if m["name"] == volume["name"]]
    # setup reads the file the ConfigMap's key becomes under its mount.
    path = Path(setup["command"][setup["command"].index("--config") + 1])
    assert path.parent == Path(mount["mountPath"])
    assert node_config.parse(cm["data"][path.name]).pfs


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_the_daemon_sees_the_cni_directories_at_the_nodes_paths(directory: Path) -> None:
    # The runtime's CNI_PATH and the configs of delegated IPAM plugins are
    # node paths; the daemon runs those plugins, so it must find them there.
    pod = pod_spec(directory)
    volumes = {v["name"]: v for v in pod["volumes"]}
    daemon_mounts = {m["name"]: m["mountPath"] for m in container(pod, "daemon")["volumeMounts"]}
    bin_dir, conf_dir = CNI_DIRS[directory.relative_to(KUBERNETES).as_posix()]
    for name, node_path in (("cni-bin", bin_dir), ("cni-conf", conf_dir)):
        assert volumes[name]["hostPath"]["path"] == node_path
        assert daemon_mounts[name] == node_path
    # install writes the shim into that same volume.
    install = container(pod, "install")
    (mount,) = [m for m in install["volumeMounts"] if m["name"] == "cni-bin"]
    assert install["command"][-1] == mount["mountPath"]


def test_openshift_runs_the_daemonset_under_the_privileged_scc() -> None:
    docs = rendered(KUBERNETES / "overlays" / "openshift")
    (sa,) = of_kind(docs, "ServiceAccount")
    (binding,) = of_kind(docs, "RoleBinding")
    assert pod_spec(KUBERNETES / "overlays" / "openshift")["serviceAccountName"] == sa["metadata"]["name"]
    assert binding["roleRef"]["name"] == "system:openshift:scc:privileged"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}]


def test_a_pool_overlay_runs_only_on_its_pool_beside_other_pools() -> None:
    directory = KUBERNETES / "overlays" / "pool-example"
    (ds,) = of_kind(rendered(directory), "DaemonSet")
    (base,) = of_kind(rendered(KUBERNETES / "base"), "DaemonSet")
    pool = {"sriov-cni/pool": "example"}
    assert pool.items() <= ds["spec"]["template"]["spec"]["nodeSelector"].items()
    # Its own selector, or two pools' DaemonSets would count each other's pods.
    assert pool.items() <= ds["spec"]["selector"]["matchLabels"].items()
    assert ds["metadata"]["name"] != base["metadata"]["name"]
    (cm,) = of_kind(rendered(directory), "ConfigMap")
    assert cm["data"]["node.yaml"] == (directory / "node.yaml").read_text()


def test_setup_writes_the_rdma_boot_option_on_the_node_and_lets_the_daemon_start() -> None:
    pod = pod_spec(KUBERNETES / "base")
    setup = container(pod, "setup")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in setup["volumeMounts"]}
    # Written into the container's own /etc, the option would never reach a boot.
    assert volumes[mounts[str(Paths.modprobe_dir)]]["hostPath"]["path"] == "/etc/modprobe.d"
    # Parsed as sriov-cni parses it: an option setup lacks fails here.
    assert setup["command"][:2] == ["sriov-cni", "setup"]
    params = cli.setup.make_context("setup", setup["command"][2:]).params
    assert params["allow_deferred"] is True


def nad_conf(doc: dict[str, Any]) -> dict[str, Any]:
    conf: dict[str, Any] = json.loads(doc["spec"]["config"])
    return conf


@pytest.mark.parametrize("name,doc", NADS, ids=[n for n, _ in NADS])
def test_nad_config_parses(name: str, doc: dict[str, Any]) -> None:
    assert set(doc["spec"]) == {"config"}
    conf = nad_conf(doc)
    assert conf["name"] == doc["metadata"]["name"]
    assert conf["type"] == "sriov"
    # No notes: no key is ignored for another or read under another name.
    assert nad_notes(doc) == ()


def shipped_node_configs() -> dict[str, dict[str, int]]:
    """Each shipped node config (every kustomization's, the systemd example): its PFs and their VF counts."""
    paths = [d / "node.yaml" for d in KUSTOMIZATIONS if (d / "node.yaml").exists()]
    paths.append(REPO / "deploy" / "systemd" / "node-config.example.yaml")
    texts = {p.relative_to(REPO).as_posix(): p.read_text() for p in paths}
    return {name: {s.pf: s.num_vfs for s in node_config.parse(text).pfs} for name, text in texts.items()}


def vf_indexes(entry: str) -> tuple[str, set[int]]:
    """A pfNames entry "pf#0-5,7" as the PF and its VF indexes (none: every VF)."""
    pf, _, ranges = entry.partition("#")
    indexes: set[int] = set()
    for part in filter(None, ranges.split(",")):
        first, _, last = part.partition("-")
        indexes.update(range(int(first), int(last or first) + 1))
    return pf, indexes


@pytest.mark.parametrize("name,doc", NADS, ids=[n for n, _ in NADS])
def test_a_nads_pool_is_one_a_shipped_node_config_creates(name: str, doc: dict[str, Any]) -> None:
    conf = nad_conf(doc)
    configs = shipped_node_configs()
    for entry in conf.get("pfNames", []):
        pf, indexes = vf_indexes(entry)
        fits = [c for c, pfs in configs.items() if pf in pfs and max(indexes, default=0) < pfs[pf]]
        assert fits, f"{name}: no shipped node config creates {entry} ({configs})"
    # A network any number of pods may use fixes neither a MAC nor an address.
    assert "mac" not in conf and conf.get("ipam", {}).get("type") != "static", name


def example(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in EXAMPLE_DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_device_plugin_and_the_plugin_never_hand_out_the_same_vf() -> None:
    dp = json.loads(example("ConfigMap", "sriovdp-config")["data"]["config.json"])
    (resource,) = dp["resourceList"]
    nad = example(NAD_KIND[1], "sriov-net")
    annotation = nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
    assert annotation == f"{resource['resourcePrefix']}/{resource['resourceName']}"
    base_vfs = shipped_node_configs()["deploy/kubernetes/base/node.yaml"]
    self_allocated = [
        vf_indexes(e) for _, d in NADS if "pfNames" in nad_conf(d) for e in nad_conf(d)["pfNames"] if "#" in e
    ]
    for entry in resource["selectors"]["pfNames"]:
        pf, indexes = vf_indexes(entry)
        assert max(indexes) < base_vfs[pf], f"{entry}: beyond the base's {base_vfs[pf]} VFs of {pf}"
        for other_pf, other in self_allocated:
            assert other_pf != pf or not indexes & other, f"{entry} overlaps a NAD's pool {other_pf} {other}"


PODS = [(n, d) for n, d in API_EXAMPLES if d["kind"] == "Pod"]


@pytest.mark.parametrize("name,doc", PODS, ids=[n for n, _ in PODS])
def test_an_example_pod_names_an_example_network_and_its_resource(name: str, doc: dict[str, Any]) -> None:
    networks = doc["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"]
    nad = example(NAD_KIND[1], networks)
    wanted = nad["metadata"].get("annotations", {}).get("k8s.v1.cni.cncf.io/resourceName")
    requests = {k for c in doc["spec"]["containers"] for k in c.get("resources", {}).get("requests", {})}
    # Without network-resources-injector, the pod asks for the device plugin's VF itself.
    assert requests == ({wanted} if wanted else set()), name
