"""kubelet's part, played by the test: containerd's CRI plugin driven over
its socket, and a pod template of the DaemonSet of deploy/kubernetes/base realised through it
as kubelet realises one.

The CRI plugin is what kubelet talks to on a containerd node; through it,
RunPodSandbox reaches go-cni, libcni and the CNI executables in bin_dir
exactly as on a node.  Only kubelet's own share is played here: volumes
made on the node, init containers run in order to exit 0, then the
containers started with every mount and security setting as written.  A
field of the pod template this module does not realise fails the test
rather than being dropped, so the YAML stays what is tested.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

from tests.vm.runtimelib import run
from tests.vm.vmlib import wait_until

# The sandbox ("pause") image: Debian's static catatonit, as kubelet's pause
# reaps zombies and waits.
PAUSE_IMAGE = "localhost/sriov-cni-test-pause:1"
CATATONIT = Path("/usr/bin/catatonit")
CRI_TIMEOUT = 300.0
POLL = 0.5

# Fields of a pod template (and of its containers) that concern the API
# server, the scheduler or kubelet's own bookkeeping (eviction order, the
# message it writes into the pod's status), not what kubelet asks of the
# runtime.
POD_FIELDS_NOT_FOR_CRI = {"nodeSelector", "tolerations", "priorityClassName"}
# ports: kubelet makes them the sandbox's port mappings, which a hostNetwork
# pod does not use (its ports are the node's).
CONTAINER_FIELDS_NOT_FOR_CRI = {"name", "terminationMessagePolicy", "ports"}
# status.podIP of a hostNetwork pod is the node's address; this node has no
# Node object to take one from, and its loopback stands in.
NODE_ADDRESS = "127.0.0.1"
PROPAGATION = {
    None: pb.PROPAGATION_PRIVATE,
    "None": pb.PROPAGATION_PRIVATE,
    "HostToContainer": pb.PROPAGATION_HOST_TO_CONTAINER,
    "Bidirectional": pb.PROPAGATION_BIDIRECTIONAL,
}
QUANTITY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


# overlayfs, as on a node, with root on a tmpfs (the guest's root is itself
# an overlay, which cannot hold overlay upper directories): the native
# snapshotter copies each layer's parent in full, over 1 GB for the five
# layers of the DaemonSet's image.
SNAPSHOTTER = "overlayfs"


def containerd_config(root: Path, state: Path, socket: Path) -> str:
    """A containerd config with its CRI plugin as on a node, for this guest (``root`` on a tmpfs)."""
    return (
        "version = 2\n"
        f'root = "{root}"\n'
        f'state = "{state}"\n'
        f'[grpc]\naddress = "{socket}"\n'
        '[plugins."io.containerd.grpc.v1.cri"]\n'
        f'sandbox_image = "{PAUSE_IMAGE}"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        f'snapshotter = "{SNAPSHOTTER}"\n'
        # Debian's packaged default is /usr/lib/cni; nodes use /opt/cni/bin,
        # where the DaemonSet's install step writes the shim.
        '[plugins."io.containerd.grpc.v1.cri".cni]\n'
        'bin_dir = "/opt/cni/bin"\n'
        'conf_dir = "/etc/cni/net.d"\n'
    )


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pause_archive(dest: Path) -> Path:
    """An OCI archive of PAUSE_IMAGE: one layer holding only catatonit."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        tar.add(CATATONIT, arcname="catatonit")
    return image_archive(dest / "pause.tar", PAUSE_IMAGE, layer.getvalue(), {"Entrypoint": ["/catatonit", "-P"]})


def image_archive(archive: Path, ref: str, layer_bytes: bytes, image_config: dict[str, Any]) -> Path:
    """An OCI archive at ``archive`` of image ``ref``: one layer (a tar's bytes) and its config."""
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [_sha(layer_bytes)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _sha(layer_bytes),
                    "size": len(layer_bytes),
                }
            ],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _sha(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {"org.opencontainers.image.ref.name": ref},
                }
            ],
        }
    ).encode()
    with tarfile.open(archive, "w") as tar:
        files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        for blob in (layer_bytes, config, manifest):
            files["blobs/sha256/" + _sha(blob).removeprefix("sha256:")] = blob
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


class Cri:
    """A CRI client over containerd's socket: the calls kubelet makes."""

    def __init__(self, socket: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        # The package's messages are typed, its generated service stub is not.
        self.runtime: Any = pb_grpc.RuntimeServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self.images: Any = pb_grpc.ImageServiceStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._channel.close()

    def condition(self, name: str) -> bool:
        """Whether the runtime reports condition ``name`` (RuntimeReady, NetworkReady) true.

        NetworkReady turns true once the CRI plugin has loaded a conflist
        from conf_dir, which it watches: until then a pod outside the host
        network cannot start.
        """
        try:
            status = self.runtime.Status(pb.StatusRequest(), timeout=10)
        except grpc.RpcError:
            return False
        return any(c.type == name and c.status for c in status.status.conditions)

    def cni_config(self) -> str:
        """The CNI networks the CRI plugin has loaded, as its verbose status shows them (JSON of go-cni's config)."""
        status = self.runtime.Status(pb.StatusRequest(verbose=True), timeout=CRI_TIMEOUT)
        return str(status.info.get("cniconfig", ""))

    def has_image(self, ref: str) -> bool:
        resp: pb.ImageStatusResponse = self.images.ImageStatus(
            pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)), timeout=CRI_TIMEOUT
        )
        return resp.HasField("image")

    def run_pod(self, config: pb.PodSandboxConfig) -> str:
        resp = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=CRI_TIMEOUT)
        return str(resp.pod_sandbox_id)

    def stop_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=CRI_TIMEOUT)

    def remove_pod(self, pod_id: str) -> None:
        self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=CRI_TIMEOUT)

    def pod_status(self, pod_id: str) -> tuple[pb.PodSandboxStatus, dict[str, Any]]:
        """The sandbox's status, and the runtime's verbose info (its spec, the CNI result)."""
        resp: pb.PodSandboxStatusResponse = self.runtime.PodSandboxStatus(
            pb.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True), timeout=CRI_TIMEOUT
        )
        return resp.status, json.loads(resp.info["info"])

    def pod_netns(self, pod_id: str) -> str:
        _, info = self.pod_status(pod_id)
        [path] = [ns["path"] for ns in info["runtimeSpec"]["linux"]["namespaces"] if ns["type"] == "network"]
        return str(path)

    def pods(self) -> list[str]:
        resp = self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=CRI_TIMEOUT)
        return [str(p.id) for p in resp.items]

    def start_container(self, pod_id: str, pod: pb.PodSandboxConfig, config: pb.ContainerConfig) -> str:
        resp = self.runtime.CreateContainer(
            pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod), timeout=CRI_TIMEOUT
        )
        cid = str(resp.container_id)
        self.runtime.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=CRI_TIMEOUT)
        return cid

    def container_status(self, cid: str) -> pb.ContainerStatus:
        resp: pb.ContainerStatusResponse = self.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=cid), timeout=CRI_TIMEOUT
        )
        return resp.status

    def wait_exited(self, cid: str, timeout: float = CRI_TIMEOUT) -> pb.ContainerStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.container_status(cid)
            if status.state == pb.CONTAINER_EXITED:
                return status
            if time.monotonic() > deadline:
                pytest.fail(f"container {status.metadata.name} did not exit within {timeout:.0f} s")
            time.sleep(POLL)


@dataclass
class Containerd:
    """containerd with its CRI plugin, started by :func:`containerd_cri`."""

    cri: Cri
    socket: Path  # for ctr
    log: Path

    def import_image(self, ref: str, archive: Path) -> None:
        """An OCI archive's image into the namespace the CRI plugin serves, as a pull would leave it."""
        run(
            "ctr",
            "--address",
            str(self.socket),
            "--namespace",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            SNAPSHOTTER,
            "--base-name",
            ref.rsplit(":", 1)[0],
            str(archive),
        )


@contextmanager
def containerd_cri(storage: Path) -> Iterator[Containerd]:
    """containerd serving CRI as on a node, its root, state and socket under ``storage`` (a tmpfs), PAUSE_IMAGE imported.

    Its CNI directories are the node's (see containerd_config): the caller
    puts them in place.  containerd ends when the block does.
    """
    sock = storage / "containerd.sock"
    config = storage / "config.toml"
    config.write_text(containerd_config(storage / "root", storage / "state", sock))
    with ExitStack() as stack:
        log = stack.enter_context(open(storage / "containerd.log", "w"))
        daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
        stack.callback(daemon.wait, timeout=CRI_TIMEOUT)
        stack.callback(daemon.terminate)
        cri = Cri(sock)
        stack.callback(cri.close)
        wait_until(lambda: cri.condition("RuntimeReady"), CRI_TIMEOUT, "containerd's CRI plugin to serve")
        node = Containerd(cri, sock, storage / "containerd.log")
        node.import_image(PAUSE_IMAGE, pause_archive(storage))
        yield node


def new_pod(
    name: str,
    namespace: str,
    log_root: Path,
    *,
    host_network: bool = False,
    host_pid: bool = False,
    privileged: bool = False,
    labels: Mapping[str, str] | None = None,
) -> pb.PodSandboxConfig:
    """A sandbox config as kubelet makes one for a pod of that name."""
    uid = str(uuid.uuid4())
    log_dir = log_root / f"{namespace}_{name}_{uid}"
    log_dir.mkdir(parents=True)
    node, pod = pb.NODE, pb.POD
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
        hostname="" if host_network else name,
        log_directory=str(log_dir),
        labels=dict(labels or {}),
        linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(
                    network=node if host_network else pod, pid=node if host_pid else pod
                ),
                privileged=privileged,
            )
        ),
    )


def quantity(text: str) -> int:
    for suffix, scale in QUANTITY.items():
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * scale
    return int(text)


def _env_value(entry: Mapping[str, Any]) -> str:
    """A container's environment variable as kubelet sets it: a value, or the pod's IP."""
    _refuse_unknown(f"env {entry['name']}", entry, {"name", "value", "valueFrom"})
    if "value" in entry:
        return str(entry["value"])
    if entry["valueFrom"] != {"fieldRef": {"fieldPath": "status.podIP"}}:
        pytest.fail(f"env {entry['name']}: only status.podIP is realised here; teach tests/vm/crilib.py")
    return NODE_ADDRESS


def _expand(word: str, env: Mapping[str, str]) -> str:
    """kubelet's expansion of $(NAME) in a container's command and args (before the runtime sees them)."""
    for name, value in env.items():
        word = word.replace(f"$({name})", value)
    return word


def _refuse_unknown(what: str, spec: Mapping[str, Any], known: set[str]) -> None:
    unknown = set(spec) - known
    if unknown:
        pytest.fail(f"{what}: the CRI test does not realise {sorted(unknown)}; teach tests/vm/crilib.py")


# What kubelet masks and makes read-only in a container that is not
# privileged (its default /proc mount type).
KUBELET_MASKED_PATHS = [
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
]
KUBELET_READONLY_PATHS = ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


@dataclass
class DaemonSetPod:
    """A DaemonSet's pod on this node, realised from its template as kubelet would."""

    cri: Cri
    template: PodTemplate
    image: str | None
    pod_id: str
    config: pb.PodSandboxConfig
    containers: dict[str, str]  # name -> container ID of the running containers
    init_logs: dict[str, str]
    attempts: dict[str, int] = field(default_factory=dict)
    # What the last readiness probe printed.
    probed: str = ""

    def log(self, name: str) -> str:
        """What container ``name`` wrote in its latest attempt, as kubelet keeps it (CRI log lines)."""
        path = Path(self.config.log_directory, name, f"{self.attempts.get(name, 0)}.log")
        return path.read_text() if path.exists() else ""

    def kill(self, name: str) -> None:
        """Container ``name`` dies at once (StopContainer without a grace period sends SIGKILL)."""
        self.cri.runtime.StopContainer(
            pb.StopContainerRequest(container_id=self.containers[name], timeout=0), timeout=CRI_TIMEOUT
        )

    def stop(self, name: str) -> pb.ContainerStatus:
        """Container ``name`` stopped as kubelet stops a pod's: SIGTERM, then SIGKILL after the grace period."""
        grace = int(self.template.spec.get("terminationGracePeriodSeconds", 30))
        self.cri.runtime.StopContainer(
            pb.StopContainerRequest(container_id=self.containers[name], timeout=grace), timeout=CRI_TIMEOUT + grace
        )
        return self.cri.container_status(self.containers[name])

    def restart(self, name: str) -> None:
        """Start container ``name`` again as kubelet does: a new container, the next attempt, same sandbox."""
        [spec] = [c for c in self.template.spec["containers"] if c["name"] == name]
        self.attempts[name] = self.attempts.get(name, 0) + 1
        config = self.template.container_config(spec, self.config, self.image, self.attempts[name])
        self.containers[name] = self.cri.start_container(self.pod_id, self.config, config)

    def pid(self, name: str) -> int:
        """The node's pid of container ``name``'s process (the runtime's verbose status says it)."""
        resp = self.cri.runtime.ContainerStatus(
            pb.ContainerStatusRequest(container_id=self.containers[name], verbose=True), timeout=CRI_TIMEOUT
        )
        return int(json.loads(resp.info["info"])["pid"])

    def ready(self, name: str) -> bool:
        """kubelet's readinessProbe of container ``name``: its command, run in it (ExecSync), exits 0."""
        [spec] = [c for c in self.template.spec["containers"] if c["name"] == name]
        probe = spec["readinessProbe"]
        _refuse_unknown(f"the readinessProbe of {name}", probe, {"exec", "periodSeconds", "timeoutSeconds"})
        # This guest's root is its initramfs, which runc cannot pivot_root
        # away from: it mounts the container's root over / and chroots into
        # it, and an exec that joins that mount namespace starts in the
        # initramfs. On a node the exec starts in the container's root; here
        # it gets there by chroot (the initramfs has busybox), and runs the
        # probe as written.
        cmd = ["/bin/busybox", "chroot", f"/proc/{self.pid(name)}/root", *probe["exec"]["command"]]
        timeout = probe.get("timeoutSeconds", 1)
        try:
            resp = self.cri.runtime.ExecSync(
                pb.ExecSyncRequest(container_id=self.containers[name], cmd=cmd, timeout=timeout), timeout=CRI_TIMEOUT
            )
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            # A probe that times out failed, to kubelet as here (this guest
            # starts Python slowly while the daemon itself starts).
            self.probed = f"timed out after {timeout} s"
            return False
        self.probed = (resp.stdout + resp.stderr).decode(errors="replace")
        return bool(resp.exit_code == 0)

    def running(self, name: str) -> bool:
        """Whether container ``name`` runs; fails the test with its log once it has exited."""
        status = self.cri.container_status(self.containers[name])
        if status.state == pb.CONTAINER_EXITED:
            pytest.fail(f"container {name} exited {status.exit_code} ({status.reason}):\n{self.log(name)}")
        return status.state == pb.CONTAINER_RUNNING


class PodTemplate:
    """The pod template of a DaemonSet: its volumes made on the node, its containers as CRI configs."""

    def __init__(
        self, daemonset: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, str]], scratch: Path
    ) -> None:
        self.name = str(daemonset["metadata"]["name"])
        self.namespace = str(daemonset["metadata"]["namespace"])
        template = daemonset["spec"]["template"]
        self.labels = {str(k): str(v) for k, v in template["metadata"]["labels"].items()}
        self.spec: Mapping[str, Any] = template["spec"]
        _refuse_unknown(
            "the pod template",
            self.spec,
            POD_FIELDS_NOT_FOR_CRI
            | {
                "hostNetwork",
                "hostPID",
                "initContainers",
                "containers",
                "volumes",
                "terminationGracePeriodSeconds",
                "automountServiceAccountToken",
            },
        )
        # No API server here, so no token volume is made: realised only for
        # a template that asks for none.
        if self.spec.get("automountServiceAccountToken", True) is not False:
            pytest.fail("the pod template mounts a service account token; teach tests/vm/crilib.py")
        self.host_network = bool(self.spec.get("hostNetwork"))
        self.host_pid = bool(self.spec.get("hostPID"))
        self.volumes = {v["name"]: self._volume(v, config_maps, scratch) for v in self.spec["volumes"]}

    @staticmethod
    def _volume(
        volume: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, str]], scratch: Path
    ) -> tuple[str, bool]:
        """Where a volume is on the node, and whether kubelet mounts it read-only whatever the mount says."""
        if "hostPath" in volume:
            host = volume["hostPath"]
            path = Path(host["path"])
            kind = host.get("type", "")
            if kind == "DirectoryOrCreate":
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            elif kind == "Directory":
                if not path.is_dir():
                    pytest.fail(f"volume {volume['name']}: {path} is not a directory; kubelet would not start the pod")
            elif kind == "":
                pass  # kubelet checks nothing
            else:
                pytest.fail(f"volume {volume['name']}: hostPath type {kind!r} is not realised here")
            return str(path), False
        if "configMap" in volume:
            # kubelet writes the keys as files and mounts them read-only.
            data = config_maps[volume["configMap"]["name"]]
            path = scratch / f"configmap-{volume['name']}"
            path.mkdir()
            for key, value in data.items():
                (path / key).write_text(value)
            return str(path), True
        pytest.fail(f"volume {volume['name']}: only hostPath and configMap volumes are realised here")

    def privileged(self) -> bool:
        return any(
            c.get("securityContext", {}).get("privileged")
            for c in [*self.spec.get("initContainers", []), *self.spec["containers"]]
        )

    def container_config(
        self, container: Mapping[str, Any], pod: pb.PodSandboxConfig, image: str | None = None, attempt: int = 0
    ) -> pb.ContainerConfig:
        _refuse_unknown(
            f"container {container['name']}",
            container,
            CONTAINER_FIELDS_NOT_FOR_CRI
            | {
                "image",
                "imagePullPolicy",
                "command",
                "args",
                "env",
                "securityContext",
                "resources",
                "volumeMounts",
                "readinessProbe",
            },
        )
        env = {e["name"]: _env_value(e) for e in container.get("env", [])}
        mounts = []
        for m in container.get("volumeMounts", []):
            _refuse_unknown(f"a mount of {container['name']}", m, {"name", "mountPath", "readOnly", "mountPropagation"})
            host_path, forced_ro = self.volumes[m["name"]]
            mounts.append(
                pb.Mount(
                    container_path=m["mountPath"],
                    host_path=host_path,
                    readonly=forced_ro or bool(m.get("readOnly")),
                    propagation=PROPAGATION[m.get("mountPropagation")],
                )
            )
        sc = container.get("securityContext", {})
        _refuse_unknown(
            f"the securityContext of {container['name']}", sc, {"privileged", "capabilities", "readOnlyRootFilesystem"}
        )
        caps = sc.get("capabilities", {})
        ns = pod.linux.security_context.namespace_options
        security = pb.LinuxContainerSecurityContext(
            privileged=bool(sc.get("privileged")),
            capabilities=pb.Capability(add_capabilities=caps.get("add", []), drop_capabilities=caps.get("drop", [])),
            readonly_rootfs=bool(sc.get("readOnlyRootFilesystem")),
            namespace_options=pb.NamespaceOption(network=ns.network, pid=ns.pid),
            # kubelet asks for these in every container (the runtime leaves
            # them out of privileged ones): without them a container would
            # get to write host knobs, /proc/irq among them, that it cannot
            # on a node.
            masked_paths=KUBELET_MASKED_PATHS,
            readonly_paths=KUBELET_READONLY_PATHS,
        )
        resources = pb.LinuxContainerResources()
        limits = container.get("resources", {}).get("limits", {})
        if "memory" in limits:
            resources.memory_limit_in_bytes = quantity(limits["memory"])
        name = container["name"]
        return pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=attempt),
            image=pb.ImageSpec(image=image or container["image"]),
            command=[_expand(word, env) for word in container.get("command", [])],
            args=[_expand(word, env) for word in container.get("args", [])],
            envs=[pb.KeyValue(key=k, value=v) for k, v in env.items()],
            mounts=mounts,
            log_path=f"{name}/{attempt}.log",
            linux=pb.LinuxContainerConfig(resources=resources, security_context=security),
        )

    @staticmethod
    def pull(cri: Cri, container: Mapping[str, Any], image: str) -> None:
        """kubelet's pull decision: this node has no registry, so the image must be there and not pulled."""
        policy = container.get("imagePullPolicy")
        if policy not in ("IfNotPresent", "Never"):
            pytest.fail(f"container {container['name']}: imagePullPolicy {policy!r} would pull from a registry")
        if not cri.has_image(image):
            pytest.fail(f"container {container['name']}: image {image} is not on the node")

    def run(self, cri: Cri, log_root: Path, image: str | None = None) -> DaemonSetPod:
        """RunPodSandbox, each init container to exit 0 in turn, then the containers started.

        ``image`` stands in for every container's image (an upgrade test's
        older image); by default each runs the image the template names.
        """
        config = new_pod(
            f"{self.name}-{uuid.uuid4().hex[:5]}",
            self.namespace,
            log_root,
            host_network=self.host_network,
            host_pid=self.host_pid,
            privileged=self.privileged(),
            labels=self.labels,
        )
        pod_id = cri.run_pod(config)
        logs = {}
        for container in [*self.spec.get("initContainers", []), *self.spec["containers"]]:
            self.pull(cri, container, image or container["image"])
        for init in self.spec.get("initContainers", []):
            cid = cri.start_container(pod_id, config, self.container_config(init, config, image))
            status = cri.wait_exited(cid)
            log = Path(config.log_directory, init["name"], "0.log")
            logs[init["name"]] = log.read_text() if log.exists() else ""
            if status.exit_code != 0:
                pytest.fail(
                    f"init container {init['name']} exited {status.exit_code} ({status.reason}):\n{logs[init['name']]}"
                )
        containers = {
            c["name"]: cri.start_container(pod_id, config, self.container_config(c, config, image))
            for c in self.spec["containers"]
        }
        return DaemonSetPod(cri, self, image, pod_id, config, containers, logs)
