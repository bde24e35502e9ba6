"""An RDMA pod that works with nothing else: the daemon's NRI plugin gives its containers the device and memlock.

Real: Linux 7.3 (rig.py --kernel experimental) with rdma_rxe, igb VFs,
containerd 2.1.9 from Debian sid (tests/vm/containerd2.py; NRI on by
default) with bookworm's runc, its CRI driven by the test playing kubelet
(crilib), the static shim in /opt/cni/bin and ``sriov-cni daemon`` on the
node's socket.  Two pods on a network with ``"rdma": "soft"`` run
``ib_write_bw`` between them from containers running as uid 1000, not
privileged, with no devices, capabilities or rlimits of their own,
registering 64 MiB buffers.  The same containers without the daemon's NRI
plugin fail (no device), and a pod without an RDMA attachment gets nothing.

The containers' image is a layer of symlinks (bin, lib, lib64, sbin into
usr); the node's /usr and /etc/libibverbs.d are mounted read-only, as a
job image would carry rdma-core and perftest itself.

Under TCG every call is slow: containerd's NRI registration and request
timeouts (5 s and 2 s by default) are raised here so that a slow guest
does not drop the plugin.  On a node the defaults hold: the plugin answers
in about a millisecond (the daemon logs each answer's time).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from sriov_cni.daemon.client import DEFAULT_SOCKET
from sriov_cni.vfstore import read_allocations
from tests.docs.commands import GID_INDEX
from tests.support.daemonlib import Daemon
from tests.vm import containerd2, rdmalib
from tests.vm.crilib import CRI_TIMEOUT, PAUSE_IMAGE, Cri, image_archive, new_pod, pause_archive
from tests.vm.runtimelib import cgroup2, cni_bin_dir, mounted, render_conflist, run
from tests.vm.vmlib import Sriov, wait_until

pytestmark = [pytest.mark.sriov_vm, pytest.mark.rdma_vm("7.3")]

NODE_DIRS = ("/opt/cni/bin", "/etc/cni/net.d", "/var/lib/cni", "/run/sriov-cni", "/run/nri")
NODE_DATA = Path("/var/lib/cni")
NRI_SOCKET = "/run/nri/nri.sock"
JOB_IMAGE = "localhost/sriov-cni-test-rdma-job:1"
JOB_UID = 1000
# 64 MiB messages: ib_write_bw registers at least that.
MESSAGE = 64 << 20
IB_WRITE_BW_PORT = 18515
BOUND = 600.0
PROBE = "id -u; ulimit -l; ls -l /dev/infiniband 2>&1; true"


def job_archive(dest: Path) -> Path:
    """The job image: bin, lib, lib64 and sbin as links into /usr, which the containers mount from the node."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for name in ("bin", "lib", "lib64", "sbin"):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{name}"
            tar.addfile(info)
        for name in ("usr", "etc", "tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
    return image_archive(dest / "job.tar", JOB_IMAGE, layer.getvalue(), {"Cmd": ["/bin/sh"]})


def containerd_config(storage: Path, socket: Path) -> str:
    """containerd 2.x's (config version 3) CRI as on a node, NRI on as by default, its timeouts raised for TCG."""
    return (
        "version = 3\n"
        f"root = '{storage / 'root'}'\n"
        f"state = '{storage / 'state'}'\n"
        f"[grpc]\naddress = '{socket}'\n"
        "[plugins.'io.containerd.cri.v1.images']\nsnapshotter = 'overlayfs'\n"
        f"[plugins.'io.containerd.cri.v1.images'.pinned_images]\nsandbox = '{PAUSE_IMAGE}'\n"
        "[plugins.'io.containerd.cri.v1.runtime'.cni]\nbin_dirs = ['/opt/cni/bin']\nconf_dir = '/etc/cni/net.d'\n"
        f"[plugins.'io.containerd.nri.v1.nri']\ndisable = false\nsocket_path = '{NRI_SOCKET}'\n"
        "plugin_registration_timeout = '60s'\nplugin_request_timeout = '30s'\n"
    )


@dataclass
class DaemonLog:
    """What a daemon writes to its stderr after its banner, read as it comes (its pipe must not fill)."""

    daemon: Daemon
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.daemon.proc.stderr is not None
        for line in self.daemon.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str) -> str:
        wait_until(lambda: any(text in line for line in self.lines), BOUND, f"the daemon to say {text!r}")
        return next(line for line in self.lines if text in line)


@pytest.fixture(scope="module")
def rdma_ucm() -> Iterator[None]:
    """rdma_ucm (/dev/infiniband/rdma_cm), loaded for the module (see rdmalib)."""
    with rdmalib.rdma_ucm():
        yield


@dataclass
class Runtime:
    cri: Cri
    logs: Path
    storage: Path
    containerd_log: Path


@pytest.fixture(scope="module")
def runtime(igb_pfs: list[str]) -> Iterator[Runtime]:
    """containerd 2.x with NRI, the pause and job images imported, the static shim and the distro's plugins."""
    if not containerd2.binary().exists():
        pytest.fail(f"no containerd 2.x at {containerd2.binary()}: run `python3 -m tests.vm.containerd2` on the host")
    bindir = containerd2.binary().parent
    storage = Path(tempfile.mkdtemp(prefix="sriov-nri-"))
    with ExitStack() as stack:
        stack.callback(storage.rmdir)
        stack.enter_context(cgroup2())
        stack.enter_context(mounted("tmpfs", storage))
        for path in NODE_DIRS:
            Path(path).mkdir(parents=True, exist_ok=True)
            stack.enter_context(mounted("tmpfs", Path(path), "-o", "mode=0755"))
        run("mount", "--make-rshared", "/")
        cni_bin_dir(Path("/opt/cni/bin"))
        run("sriov-cni", "install-cni", "--dest", "/opt/cni/bin")
        sock = storage / "containerd.sock"
        config = storage / "config.toml"
        config.write_text(containerd_config(storage, sock))
        log_path = storage / "containerd.log"
        log = stack.enter_context(open(log_path, "w"))
        # sid's shim beside its containerd; bookworm's runc.
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        daemon = subprocess.Popen(
            [str(containerd2.binary()), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        stack.callback(daemon.wait, timeout=CRI_TIMEOUT)
        stack.callback(daemon.terminate)
        cri = Cri(sock)
        stack.callback(cri.close)
        wait_until(lambda: cri.condition("RuntimeReady"), CRI_TIMEOUT, "containerd's CRI plugin to serve")
        assert Path(NRI_SOCKET).is_socket(), "containerd 2.x with NRI on listens on its NRI socket"
        ctr = [str(bindir / "ctr"), "--address", str(sock), "--namespace", "k8s.io", "images", "import"]
        run(*ctr, "--base-name", PAUSE_IMAGE.rsplit(":", 1)[0], str(pause_archive(storage)))
        run(*ctr, "--base-name", JOB_IMAGE.rsplit(":", 1)[0], str(job_archive(storage)))
        (storage / "logs").mkdir()
        yield Runtime(cri, storage / "logs", storage, log_path)
        # What a failed test left: their CNI DEL needs a daemon.
        if cri.pods():
            with Daemon(Path(DEFAULT_SOCKET).parent, "--data-dir", str(NODE_DATA / "sriov"), "--no-nri"):
                for pod_id in cri.pods():
                    cri.stop_pod(pod_id)
                    cri.remove_pod(pod_id)


def rdma_network(runtime: Runtime, pf: str, **keys: str) -> None:
    """The node's network: deploy/podman/10-sriov.conflist with ``"rdma": "soft"`` and ``keys``."""
    conf = render_conflist(pf, NODE_DATA)
    conf["plugins"][0].update(rdma="soft", **keys)
    (Path("/etc/cni/net.d") / "10-sriov.conflist").write_text(json.dumps(conf))
    wait_until(lambda: runtime.cri.condition("NetworkReady"), CRI_TIMEOUT, "containerd to load the conflist")


def container(name: str, command: list[str]) -> pb.ContainerConfig:
    """A job's container: uid 1000, not privileged, no devices, capabilities or rlimits of its own."""
    node_files = [
        pb.Mount(container_path="/usr", host_path="/usr", readonly=True),
        pb.Mount(container_path="/etc/libibverbs.d", host_path="/etc/libibverbs.d", readonly=True),
    ]
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image=JOB_IMAGE),
        command=command,
        log_path=f"{name}.log",
        mounts=node_files,
        linux=pb.LinuxContainerConfig(
            security_context=pb.LinuxContainerSecurityContext(run_as_user=pb.Int64Value(value=JOB_UID))
        ),
    )


@dataclass
class Pod:
    id: str
    config: pb.PodSandboxConfig

    def log(self, name: str) -> str:
        """A container's output, without CRI's timestamp, stream and tag."""
        text = (Path(self.config.log_directory) / f"{name}.log").read_text()
        return "\n".join(line.split(" ", 3)[3] for line in text.splitlines() if line.count(" ") >= 3)


def start_pod(runtime: Runtime, name: str, *, host_network: bool = False) -> Pod:
    config = new_pod(name, "default", runtime.logs, host_network=host_network)
    return Pod(runtime.cri.run_pod(config), config)


def run_to_end(runtime: Runtime, pod: Pod, name: str, command: list[str]) -> tuple[int, str]:
    cid = runtime.cri.start_container(pod.id, pod.config, container(name, command))
    status = runtime.cri.wait_exited(cid, BOUND)
    return status.exit_code, pod.log(name)


def remove(runtime: Runtime, *pods: Pod) -> None:
    for pod in pods:
        runtime.cri.stop_pod(pod.id)
        runtime.cri.remove_pod(pod.id)


def start_limited_pod(runtime: Runtime, name: str, limit: int) -> Pod:
    """A pod of the network once containerd reloaded it with ``rdmaMemlock`` (it watches its conf_dir)."""
    deadline = time.monotonic() + BOUND
    while True:
        pod = start_pod(runtime, name)
        (alloc,) = [a for a in read_allocations(NODE_DATA / "sriov") if a.container_id == pod.id]
        if alloc.rdma_memlock == limit:
            return pod
        remove(runtime, pod)
        assert time.monotonic() < deadline, "containerd did not load the changed conflist"
        time.sleep(1)


def pod_device(pod: Pod) -> str:
    """The Soft-RoCE device the plugin made in the pod (its record's)."""
    (device,) = [a.rdma_device for a in read_allocations(NODE_DATA / "sriov") if a.container_id == pod.id]
    assert device is not None
    return device


# The one-liner of docs/rdma.md ("Running an RDMA job"), $dev and $ip its arguments.
GID_ONE_LINER = f"dev=$1 ip=$2; {GID_INDEX.text}; true"


def roce_v2_gid_index(netns: str, device: str, address: str) -> int:
    """The RoCE v2 GID index of ``address`` on ``device``, found in the pod's netns by the README's one-liner.

    ``ip netns exec`` mounts the namespace's own /sys, which in exclusive
    mode alone shows the pod's device.
    """
    found = run("ip", "netns", "exec", Path(netns).name, "sh", "-c", GID_ONE_LINER, "gid", device, address).stdout
    assert len(found.split()) == 1, f"{device} has no single RoCE v2 GID for {address}: {found!r}"
    return int(found)


def ib_write_bw(runtime: Runtime, server: Pod, client: Pod, tag: str) -> tuple[int, str, int, str]:
    """ib_write_bw with 64 MiB messages, server in ``server``, client in ``client``: exit codes and outputs."""
    devices = [pod_device(p) for p in (server, client)]
    address = [runtime.cri.pod_status(p.id)[0].network.ip for p in (server, client)]
    netns = [runtime.cri.pod_netns(p.id) for p in (server, client)]
    gids = [roce_v2_gid_index(n, d, a) for n, d, a in zip(netns, devices, address, strict=True)]
    bw = ["ib_write_bw", "-F", "-n", "5", "-s", str(MESSAGE), "--report_gbits"]
    srv = runtime.cri.start_container(
        server.id, server.config, container(f"server-{tag}", [*bw, "-d", devices[0], "-x", str(gids[0])])
    )

    def listening_or_ended() -> bool:
        ss = subprocess.run(["nsenter", f"--net={netns[0]}", "ss", "-Hltn"], capture_output=True, text=True).stdout
        return f":{IB_WRITE_BW_PORT} " in ss or runtime.cri.container_status(srv).state == pb.CONTAINER_EXITED

    wait_until(listening_or_ended, BOUND, "ib_write_bw's server to listen or end")
    if runtime.cri.container_status(srv).state == pb.CONTAINER_EXITED:
        return runtime.cri.container_status(srv).exit_code, server.log(f"server-{tag}"), -1, ""
    client_cmd = [*bw, "-d", devices[1], "-x", str(gids[1]), address[0]]
    cli = runtime.cri.start_container(client.id, client.config, container(f"client-{tag}", client_cmd))
    cli_status = runtime.cri.wait_exited(cli, BOUND)
    srv_status = runtime.cri.wait_exited(srv, BOUND)
    return srv_status.exit_code, server.log(f"server-{tag}"), cli_status.exit_code, client.log(f"client-{tag}")


def test_rdma_pods_run_ib_write_bw_as_a_user_with_only_the_network_asked_for(
    runtime: Runtime, rdma_ucm: None, igb_pfs: list[str], sriov: Sriov
) -> None:
    started = time.monotonic()
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    rdma_network(runtime, pf)
    node_socket = Path(DEFAULT_SOCKET).parent
    data = NODE_DATA / "sriov"

    # Without the NRI plugin: the pods get their devices, their containers cannot use them.
    with Daemon(node_socket, "--data-dir", str(data), "--no-nri"):
        pods = [start_pod(runtime, f"rdma-{i}") for i in range(2)]
        code, probe = run_to_end(runtime, pods[0], "probe-without", ["sh", "-c", PROBE])
        print(f"--- an RDMA pod's container without the NRI plugin:\n{probe}")
        assert code == 0, probe
        assert probe.splitlines()[:2] == [str(JOB_UID), "8192"]
        assert "No such file or directory" in probe
        srv_code, srv_out, _, _ = ib_write_bw(runtime, pods[0], pods[1], "without")
        print(f"--- ib_write_bw without the NRI plugin (exit {srv_code}):\n{srv_out}")
        assert srv_code != 0
        # No /dev/infiniband: libibverbs finds no device it can open.
        assert "Unable to find the Infiniband/RoCE device" in srv_out, srv_out

    # With it: a daemon restart registers again.
    with Daemon(node_socket, "--data-dir", str(data)) as daemon:
        log = DaemonLog(daemon)
        print(log.wait_for("registered with containerd"))
        plain = start_pod(runtime, "plain", host_network=True)
        code, probe = run_to_end(runtime, pods[0], "probe", ["sh", "-c", PROBE])
        print(f"--- an RDMA pod's container:\n{probe}")
        assert code == 0, probe
        lines = probe.splitlines()
        assert lines[:2] == [str(JOB_UID), "unlimited"]
        uverbs = [line for line in lines if " uverbs" in line]
        assert len(uverbs) == 1 and uverbs[0].startswith("crw-rw-rw-"), probe
        rdma_cm = [line for line in lines if line.endswith(" rdma_cm")]
        assert len(rdma_cm) == 1 and rdma_cm[0].startswith("crw-rw-rw-"), probe
        assert len(lines) == 5, probe  # id, limit, "total 0", uverbsN, rdma_cm: no umad, issm or other pod's
        code, plain_probe = run_to_end(runtime, plain, "probe", ["sh", "-c", PROBE])
        assert code == 0, plain_probe
        print(f"--- a plain pod's container:\n{plain_probe}")
        assert plain_probe.splitlines()[:2] == [str(JOB_UID), "8192"]
        assert "No such file or directory" in plain_probe

        srv_code, srv_out, cli_code, cli_out = ib_write_bw(runtime, pods[0], pods[1], "with")
        print(f"--- ib_write_bw server:\n{srv_out}\n--- ib_write_bw client:\n{cli_out}")
        assert srv_code == 0 and cli_code == 0
        assert "BW average" in cli_out and str(MESSAGE) in cli_out

        remove(runtime, *pods, plain)

        # A network's rdmaMemlock below what the job registers: the limit is
        # the pods', and ib_write_bw fails for it.
        rdma_network(runtime, pf, rdmaMemlock="16Mi")
        limited = [start_limited_pod(runtime, f"limited-{i}", 16 << 20) for i in range(2)]
        code, probe = run_to_end(runtime, limited[0], "probe", ["sh", "-c", PROBE])
        print(f"--- a container of a pod whose network has rdmaMemlock 16Mi:\n{probe}")
        assert code == 0 and probe.splitlines()[:2] == [str(JOB_UID), str(16 << 10)], probe
        srv_code, srv_out, cli_code, cli_out = ib_write_bw(runtime, limited[0], limited[1], "limited")
        print(f"--- ib_write_bw under 16 MiB:\n{srv_out}\n{cli_out}")
        assert srv_code != 0 and "Couldn't allocate MR" in srv_out + cli_out
        remove(runtime, *limited)
        assert runtime.cri.pods() == []
        assert read_allocations(data) == []
        assert json.loads(run("rdma", "-j", "dev").stdout or "[]") == []
    # The plugin's process writes its session's summary once the daemon ended.
    print(log.wait_for("CreateContainer answers"))
    print("\n".join(line for line in log.lines if "nri:" in line))
    print(f"module's test took {time.monotonic() - started:.1f} s")
