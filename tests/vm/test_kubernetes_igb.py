"""sriov as Kubernetes runs it, on igb: the DaemonSet's pod and the pods it
serves, through containerd's CRI plugin, with the test playing kubelet.

The DaemonSet's pod is realised from deploy/kubernetes/base as kustomize renders it (crilib):
its install step writes the shim into the node's /opt/cni/bin, setup
creates the VFs from the ConfigMap's node config, and the daemon serves the
node's socket from the image deploy/image/build-image.sh built.  Pods then start
as kubelet starts them: RunPodSandbox makes containerd run the conflist in
/etc/cni/net.d through libcni, which execs the shim, which forwards to the
daemon in its pod.  Effects are read on the PF with ``ip -j`` and in the
pods' namespaces through ``nsenter``, not through the runtime.

Needs the image as an OCI archive where the guest sees it, made on the host:
``deploy/image/build-image.sh --offline --oci-archive <rig cache>/sriov-cni-image.tar``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from sriov_cni.daemon.client import DEFAULT_SOCKET
from tests.deploy.kube import render
from tests.vm.crilib import (
    CRI_TIMEOUT,
    Cri,
    DaemonSetPod,
    PodTemplate,
    containerd_cri,
    new_pod,
)
from tests.vm.runtimelib import (
    assert_as_found,
    assert_pings,
    assert_pod_carrier,
    cgroup2,
    cni_bin_dir,
    ipv4,
    leases,
    mounted,
    pod_eth0,
    records,
    render_conflist,
    run,
    vf_picture,
)
from tests.vm.vmlib import Sriov, numvfs, vf_pci_dirs, wait_until

pytestmark = pytest.mark.sriov_vm

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "kubernetes" / "base"
ARCHIVE_NAME = "sriov-cni-image.tar"
# The node paths the DaemonSet and containerd write, each a fresh directory
# for this module so that nothing of it outlives the module in the guest.
NODE_DIRS = ("/opt/cni/bin", "/etc/cni/net.d", "/var/lib/cni", "/run/sriov-cni")
# Where the conflist keeps the plugin's records and sriov-ipam's leases: the
# node's /var/lib/cni, which the daemon's pod mounts.
NODE_DATA = Path("/var/lib/cni")
# deploy/podman/10-sriov.conflist's network.
NETWORK = "sriovnet"
VFS = 2


def manifests() -> dict[str, dict[str, Any]]:
    """The base's objects as `kubectl apply -k` sends them (the pinned kubectl of the host, seen through its root)."""
    return {d["kind"]: d for d in render(BASE)}


def image_archive() -> Path:
    from tests.vm.rig import cache_dir  # the guest sees the rig's cache through the host root

    archive = cache_dir() / ARCHIVE_NAME
    if not archive.exists():
        pytest.fail(
            f"no image archive at {archive}: on the host, run deploy/image/build-image.sh --offline --oci-archive {archive}"
        )
    return archive


@dataclass
class Node:
    cri: Cri
    containerd: Path  # its socket, for ctr
    logs: Path  # kubelet's /var/log/pods
    scratch: Path
    containerd_log: Path

    def containerd_says(self, lines: int = 30) -> str:
        return "\n".join(self.containerd_log.read_text().splitlines()[-lines:])


@pytest.fixture(scope="module")
def node(igb_pfs: list[str]) -> Iterator[Node]:
    """containerd with its CRI plugin as on a node, the DaemonSet's image and a pause image imported."""
    archive = image_archive()
    # Short: containerd's state path ends up in socket paths of its shims.
    storage = Path(tempfile.mkdtemp(prefix="sriov-k8s-"))
    with ExitStack() as stack:
        stack.callback(storage.rmdir)
        stack.enter_context(cgroup2())
        stack.enter_context(mounted("tmpfs", storage))
        for path in NODE_DIRS:
            # 0755 as on a node (a tmpfs is 1777 by default, a directory the
            # daemon refuses to put its socket in).
            stack.enter_context(mounted("tmpfs", Path(path), "-o", "mode=0755"))
        # systemd makes / shared on a node: CRI refuses HostToContainer from
        # a private mount, and the daemon would not see pods' namespaces
        # mounted after it started.
        run("mount", "--make-rshared", "/")
        # The reference plugins the conflist chains (tuning) and the
        # loopback containerd adds, as a node has them in /opt/cni/bin.
        cni_bin_dir(Path("/opt/cni/bin"))
        containerd = stack.enter_context(containerd_cri(storage))
        cri = containerd.cri
        containerd.import_image(manifests()["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["image"], archive)
        (storage / "logs").mkdir()
        (storage / "scratch").mkdir()
        yield Node(cri, containerd.socket, storage / "logs", storage / "scratch", containerd.log)
        # Before containerd stops: its sandboxes' CNI DEL needs the daemon.
        for pod_id in cri.pods():
            cri.stop_pod(pod_id)
            cri.remove_pod(pod_id)


def node_config(written: str, pf: str) -> str:
    """The ConfigMap's node config, its tuning included (not its MTU), for this guest's PF and VFS VFs."""
    conf = yaml.safe_load(written)
    [entry] = conf["pfs"]
    entry.update(pf=pf, numVfs=VFS)
    # setup never lowers a PF's MTU, and the guest modules after this one
    # expect the PF's own.
    entry.pop("mtu", None)
    return yaml.safe_dump(conf)


@dataclass
class Deployment:
    """The DaemonSet on this node: its template, and the pod that runs it now."""

    template: PodTemplate
    pod: DaemonSetPod


@pytest.fixture(scope="module")
def deployment(node: Node, igb_pfs: list[str]) -> Iterator[Deployment]:
    """The DaemonSet's pod, serving the node's socket, shared by the module's tests; removed after them.

    A test that stops its daemon starts it again, or replaces the pod, before
    it ends.
    """
    sriov = Sriov(igb_pfs)
    docs = manifests()
    cm = docs["ConfigMap"]
    [key] = cm["data"]
    template = PodTemplate(
        docs["DaemonSet"],
        {cm["metadata"]["name"]: {key: node_config(cm["data"][key], igb_pfs[0])}},
        Path(tempfile.mkdtemp(dir=node.scratch)),
    )
    deployed = Deployment(template, template.run(node.cri, node.logs))
    try:
        wait_serving(node, deployed.pod)
        yield deployed
    finally:
        node.cri.stop_pod(deployed.pod.pod_id)
        node.cri.remove_pod(deployed.pod.pod_id)
        sriov.restore()


@pytest.fixture
def daemonset(deployment: Deployment) -> DaemonSetPod:
    return deployment.pod


def wait_serving(node: Node, pod: DaemonSetPod) -> None:
    try:
        wait_until(
            lambda: pod.running("daemon") and pod.ready("daemon"),
            CRI_TIMEOUT,
            f"the daemon container to be ready, serving {DEFAULT_SOCKET}",
        )
    except pytest.fail.Exception as exc:
        pytest.fail(
            f"{exc}\nits readiness probe said: {pod.probed}\n"
            f"daemon's log:\n{pod.log('daemon')}\n{DEFAULT_SOCKET}'s directory: "
            f"{sorted(p.name for p in Path(DEFAULT_SOCKET).parent.iterdir())}\n"
            f"containerd's log:\n{node.containerd_says()}"
        )


def sriov_network(node: Node, pf: str) -> None:
    """deploy/podman/10-sriov.conflist on the node, for this guest's PF, loaded by containerd."""
    (Path("/etc/cni/net.d") / "10-sriov.conflist").write_text(json.dumps(render_conflist(pf, NODE_DATA)))
    wait_until(lambda: node.cri.condition("NetworkReady"), CRI_TIMEOUT, "containerd to load the conflist")


def pod_addresses(node: Node, pod_id: str) -> tuple[str, dict[str, Any]]:
    """A pod's network namespace and its eth0, checked to be what CRI reports."""
    netns = node.cri.pod_netns(pod_id)
    eth0 = pod_eth0(netns)
    status, _ = node.cri.pod_status(pod_id)
    # CRI reports the address the plugin gave it, read from the CNI result.
    assert status.network.ip == ipv4(eth0).split("/")[0]
    return netns, eth0


def remove_pods(node: Node, *pod_ids: str) -> None:
    for pod_id in pod_ids:
        node.cri.stop_pod(pod_id)
        node.cri.remove_pod(pod_id)


def calls_running(pod: DaemonSetPod) -> int:
    """Calls the daemon container's children run now: each leads its own process group (idle ones do not)."""
    pid = pod.pid("daemon")
    running = 0
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            running += os.getpgid(int(child)) == int(child)
        except ProcessLookupError:
            pass  # ended meanwhile
    return running


@contextmanager
def ipam_held() -> Iterator[None]:
    """sriov-ipam's lock on the conflist's network held here: calls wait in their IPAM step, in flight.

    They wait up to its lock timeout (30 s), then fail "busy".
    """
    store = NODE_DATA / "ipam" / NETWORK
    store.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(store / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def shim_call(command: str, container: str, pf: str) -> subprocess.CompletedProcess[str]:
    """The conflist's sriov plugin run as libcni runs it: /opt/cni/bin/sriov, the shim, with its config."""
    conf = render_conflist(pf, NODE_DATA)
    plugin = {"cniVersion": conf["cniVersion"], "name": conf["name"], **conf["plugins"][0]}
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": "/var/run/netns/none",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["/opt/cni/bin/sriov"], input=json.dumps(plugin), env=env, capture_output=True, text=True, timeout=CRI_TIMEOUT
    )


def failed_with(call: Future[Any], text: str, daemonset: DaemonSetPod) -> None:
    """The CRI call failed with the CNI error the shim printed, as kubelet reports it."""
    with pytest.raises(grpc.RpcError) as failed:
        call.result(timeout=CRI_TIMEOUT)
    assert text in str(failed.value.details()), f"{failed.value.details()}\ndaemon's log:\n{daemonset.log('daemon')}"


def nothing_held(node: Node, pf: str, before: dict[int, dict[str, Any]], daemonset_pod: str) -> None:
    """Every VF as found, no record, no lease, and no pod but the DaemonSet's."""
    assert_as_found(vf_picture(pf), before)
    assert records(NODE_DATA) == [] and leases(NODE_DATA) == []
    assert set(node.cri.pods()) == {daemonset_pod}


def queue_irq_cpus(vf_pci: str) -> dict[str, str]:
    """A VF's queue IRQs (named in /proc/interrupts) and the CPUs each may run on."""
    irqs = {p.name for p in Path("/sys/bus/pci/devices", vf_pci, "msi_irqs").iterdir()}
    names = {}
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        irq, _, rest = line.strip().partition(":")
        if irq in irqs:
            names[irq] = rest.split()[-1]
    return {
        names[irq]: Path(f"/proc/irq/{irq}/smp_affinity_list").read_text().strip()
        for irq in sorted(names)
        if re.search(r"-(rx|tx|TxRx)-\d+$", names[irq])
    }


def test_daemonset_pod_serves_two_pods_that_ping_and_give_vfs_back(
    node: Node, daemonset: DaemonSetPod, igb_pfs: list[str]
) -> None:
    pf = igb_pfs[0]
    # The init containers did their part on the node: setup created the
    # VFs, install wrote the shim where containerd's bin_dir is.
    assert numvfs(pf) == VFS
    for name in ("sriov", "sriov-ipam"):
        assert Path("/opt/cni/bin", name).read_bytes()[:4] == b"\x7fELF"
    vf_pcis = [d.name for d in vf_pci_dirs(pf)]
    sriov_network(node, pf)
    before = vf_picture(pf)
    assert records(NODE_DATA) == [] and leases(NODE_DATA) == []

    pods = {name: node.cri.run_pod(new_pod(name, "default", node.logs)) for name in ("a", "b")}

    netns, eth0 = {}, {}
    for name, pod_id in pods.items():
        netns[name], eth0[name] = pod_addresses(node, pod_id)
    # Each pod has its own VF as eth0.
    assert sorted(e["parentdev"] for e in eth0.values()) == sorted(vf_pcis)
    assert all(v["netdev"] is None for v in vf_picture(pf).values())
    assert records(NODE_DATA) == sorted(vf_pcis)
    assert len(leases(NODE_DATA)) == 2
    for ns in netns.values():
        assert_pod_carrier(ns)
    # The daemon, not privileged, exempted itself from the OOM killer.
    assert Path(f"/proc/{daemonset.pid('daemon')}/oom_score_adj").read_text() == "-1000\n"
    # The node config tunes the PF, so the daemon pinned each VF's queue
    # IRQs to one CPU as its pod started: it writes the host's /proc/irq
    # through its mount of it.
    for vf_pci in vf_pcis:
        cpus = queue_irq_cpus(vf_pci)
        assert cpus and all(re.fullmatch(r"\d+", c) for c in cpus.values()), (vf_pci, cpus)
    assert_pings(netns["a"], ipv4(eth0["b"]))
    assert_pings(netns["b"], ipv4(eth0["a"]))

    remove_pods(node, *pods.values())

    nothing_held(node, pf, before, daemonset.pod_id)
    assert not any(Path(ns).exists() for ns in netns.values())


def test_daemon_killed_while_pods_start_and_stop_loses_nothing_and_the_retries_succeed(
    node: Node, daemonset: DaemonSetPod, igb_pfs: list[str]
) -> None:
    pf = igb_pfs[0]
    sriov_network(node, pf)
    before = vf_picture(pf)
    attached = node.cri.run_pod(new_pod("attached", "default", node.logs))

    with ThreadPoolExecutor(2) as pool:
        with ipam_held():
            starting = pool.submit(node.cri.run_pod, new_pod("starting", "default", node.logs))
            stopping = pool.submit(node.cri.stop_pod, attached)
            wait_until(lambda: calls_running(daemonset) == 2, CRI_TIMEOUT, "an ADD and a DEL to run in the daemon")
            # SIGKILL to the container: the daemon and the children running
            # the calls die with it.
            daemonset.kill("daemon")
            failed_with(starting, "ended without an answer", daemonset)
            failed_with(stopping, "ended without an answer", daemonset)
        # While it is down, a call is not even taken.
        failed_with(
            pool.submit(node.cri.run_pod, new_pod("early", "default", node.logs)),
            "sriov-cni daemon is not reachable",
            daemonset,
        )

    # kubelet restarts the container in the same sandbox, and retries: the
    # failed sandboxes' DELs (which find what the killed calls left), the
    # stop, the start.
    daemonset.restart("daemon")
    wait_serving(node, daemonset)
    remove_pods(node, *(set(node.cri.pods()) - {daemonset.pod_id}))
    nothing_held(node, pf, before, daemonset.pod_id)
    pod_id = node.cri.run_pod(new_pod("starting", "default", node.logs))

    _, eth0 = pod_addresses(node, pod_id)
    assert eth0["parentdev"] in [d.name for d in vf_pci_dirs(pf)]
    assert records(NODE_DATA) == [eth0["parentdev"]] and len(leases(NODE_DATA)) == 1
    remove_pods(node, pod_id)
    nothing_held(node, pf, before, daemonset.pod_id)
    assert not list(Path("/run/netns").glob("cni-*"))


def test_sigterm_lets_a_pod_start_in_flight_end_and_refuses_new_calls(
    node: Node, daemonset: DaemonSetPod, igb_pfs: list[str]
) -> None:
    pf = igb_pfs[0]
    sriov_network(node, pf)
    before = vf_picture(pf)

    with ThreadPoolExecutor(2) as pool:
        with ipam_held():
            starting = pool.submit(node.cri.run_pod, new_pod("in-flight", "default", node.logs))
            wait_until(lambda: calls_running(daemonset) == 1, CRI_TIMEOUT, "the pod's ADD to run in the daemon")
            # kubelet stopping the DaemonSet's pod: SIGTERM, SIGKILL after
            # terminationGracePeriodSeconds.
            stopped = pool.submit(daemonset.stop, "daemon")
            wait_until(
                lambda: "new calls are refused, 1 running" in daemonset.log("daemon"),
                CRI_TIMEOUT,
                "the daemon to say it stops",
            )
            # A new call, as libcni makes it: straight to the node's shim
            # (a RunPodSandbox here can take longer than the drain to reach it).
            late = shim_call("ADD", "late", pf)
            assert late.returncode == 1 and json.loads(late.stdout) == {
                "cniVersion": "1.0.0",
                "code": 11,
                "msg": "the sriov-cni daemon is stopping; nothing ran",
            }, late
            # Only the call in flight holds a VF.
            assert len(records(NODE_DATA)) == 1 and leases(NODE_DATA) == []
        pod_id = starting.result(timeout=CRI_TIMEOUT)
        status = stopped.result(timeout=CRI_TIMEOUT)
    assert status.exit_code == 0, daemonset.log("daemon")
    assert "stopped, no call running" in daemonset.log("daemon")
    _, eth0 = pod_addresses(node, pod_id)
    assert records(NODE_DATA) == [eth0["parentdev"]] and len(leases(NODE_DATA)) == 1

    daemonset.restart("daemon")
    wait_serving(node, daemonset)
    remove_pods(node, *(set(node.cri.pods()) - {daemonset.pod_id}))
    nothing_held(node, pf, before, daemonset.pod_id)


def test_pods_attached_under_one_image_tag_are_deleted_by_the_daemonset_of_another(
    node: Node, deployment: Deployment, igb_pfs: list[str]
) -> None:
    # The second tag names the same image (a retag; no registry here to
    # build and pull another version from): what this shows is the rolling
    # update itself, a new pod whose install and setup run again while pods
    # hold VFs, and whose daemon DELs what the old pod's attached.  The
    # records of older versions reading in newer code are the host's tests
    # (tests/test_vf_store.py).
    pf = igb_pfs[0]
    sriov_network(node, pf)
    before = vf_picture(pf)
    attached = node.cri.run_pod(new_pod("attached", "default", node.logs))
    _, eth0 = pod_addresses(node, attached)

    old = deployment.pod
    image = old.template.spec["containers"][0]["image"]
    upgraded = image.rsplit(":", 1)[0] + ":upgraded"
    run("ctr", "--address", str(node.containerd), "--namespace", "k8s.io", "images", "tag", "--force", image, upgraded)
    assert old.stop("daemon").exit_code == 0
    remove_pods(node, old.pod_id)
    deployment.pod = deployment.template.run(node.cri, node.logs, image=upgraded)
    wait_serving(node, deployment.pod)
    assert deployment.pod.config.metadata.uid != old.config.metadata.uid
    assert records(NODE_DATA) == [eth0["parentdev"]] and len(leases(NODE_DATA)) == 1

    remove_pods(node, attached)
    nothing_held(node, pf, before, deployment.pod.pod_id)
