"""The daemon's NRI plugin: which containers get which devices and limit, and its session with a runtime.

The pods' records are written to a temporary store and their devices to
a fixture sysfs tree; the runtime is a stand-in on a unix socket speaking
the wire of tests/daemon/test_nriwire.py.  The real runtime (containerd
2.x) is the guest's: tests/vm/test_nri_rdma.py.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sriov_cni.daemon import nri, nriwire, rdmaaccess
from sriov_cni.daemon.nriwire import Call, Device, NewContainer, Reply, Trunk
from sriov_cni.vfstore import Allocation, FileStore
from tests.support.daemonlib import Daemon
from tests.support.nodetree import Tree

POD_A = "a" * 64
POD_B = "b" * 64
POD_PLAIN = "c" * 64
UVERBS = "/dev/infiniband/uverbs"
RDMA_CM = Device("/dev/infiniband/rdma_cm", 10, 58)


def _record(
    data_dir: Path, vf: str, pod: str, device: str | None, memlock: int | None = None, soft: bool = False
) -> None:
    alloc = Allocation(vf, "0000:01:00.0", "eth0", int(vf[-1]), "net-a", pod, "net1", f"/run/netns/{pod[:4]}", None)
    alloc.rdma_device, alloc.rdma_soft, alloc.rdma_memlock = device, soft, memlock
    FileStore(data_dir).put(alloc)


def _char(tree: Tree, device_class: str, name: str, numbers: str) -> None:
    d = tree.sys / "class" / device_class / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "dev").write_text(numbers + "\n")


@pytest.fixture
def node(tree: Tree, tmp_path: Path) -> Path:
    """Pod A: a VF's mlx5_3 (moved into it, uverbs3), memlock 64 MiB; pod B: a Soft-RoCE device (uverbs1) and
    a second VF's mlx5_4 (uverbs4) of another network with no limit; a plain pod; rdma_cm loaded."""
    data = tmp_path / "data"
    tree.rdma("0000:01:10.1", "mlx5_3", uverbs=3, here=False)
    tree.rdma("0000:01:10.2", "mlx5_4", uverbs=4, here=False)
    _char(tree, "infiniband_verbs", "uverbs3", "231:195")
    _char(tree, "infiniband_verbs", "uverbs4", "231:196")
    # A Soft-RoCE device has no PCI function: only the class lists it.
    _char(tree, "infiniband_verbs", "uverbs1", "231:193")
    (tree.sys / "class" / "infiniband_verbs" / "uverbs1" / "ibdev").write_text("rxe_0000_01_10_5\n")
    _char(tree, "misc", "rdma_cm", "10:58")
    _record(data, "0000:01:10.1", POD_A, "mlx5_3", 64 << 20)
    _record(data, "0000:01:10.5", POD_B, "rxe_0000_01_10_5", 1 << 30, soft=True)
    _record(data, "0000:01:10.2", POD_B, "mlx5_4", None)
    _record(data, "0000:01:10.3", POD_PLAIN, None)
    return data


def test_a_pod_gets_its_own_device_and_its_network_limit(node: Path, tree: Tree) -> None:
    access = rdmaaccess.for_pod(POD_A, node, tree.sys)
    assert access == rdmaaccess.Access((Device(f"{UVERBS}3", 231, 195), RDMA_CM), 64 << 20)


def test_two_attachments_give_both_devices_and_the_higher_limit(node: Path, tree: Tree) -> None:
    access = rdmaaccess.for_pod(POD_B, node, tree.sys)
    assert access is not None
    assert access.devices == (Device(f"{UVERBS}1", 231, 193), Device(f"{UVERBS}4", 231, 196), RDMA_CM)
    assert access.memlock is None  # one network leaves it unlimited


def test_pods_without_an_rdma_attachment_get_nothing(node: Path, tree: Tree) -> None:
    assert rdmaaccess.for_pod(POD_PLAIN, node, tree.sys) is None
    assert rdmaaccess.for_pod("f" * 64, node, tree.sys) is None
    assert rdmaaccess.for_pod(POD_A, node.parent / "never-written", tree.sys) is None


def test_the_uverbs_number_is_read_when_the_container_is_created(node: Path, tree: Tree) -> None:
    # A move gave the device another number since ADD (ib_uverbs takes the
    # lowest free one).
    verbs = tree.devices / "0000:01:10.1" / "infiniband_verbs"
    (verbs / "uverbs3").rename(verbs / "uverbs0")
    _char(tree, "infiniband_verbs", "uverbs0", "231:192")
    access = rdmaaccess.for_pod(POD_A, node, tree.sys)
    assert access is not None
    assert access.devices[0] == Device(f"{UVERBS}0", 231, 192)


def test_without_ib_uverbs_or_rdma_ucm_only_the_limit_is_raised(node: Path, tree: Tree) -> None:
    for entry in (tree.devices / "0000:01:10.1" / "infiniband_verbs").iterdir():
        (entry / "ibdev").unlink()
    (tree.sys / "class" / "misc" / "rdma_cm" / "dev").unlink()
    assert rdmaaccess.for_pod(POD_A, node, tree.sys) == rdmaaccess.Access((), 64 << 20)


def _launch(node: Path, tree: Tree, sock: str = "/nonexistent", retry: float = nri.RETRY) -> nri.Launch:
    return nri.Launch(sock, node, tree.sys, None, retry)


def _create(pod: str, name: str = "main") -> Call:
    request = NewContainer(pod, "default", "pod", "ctr-" + name, name)
    pod_msg = nriwire.field_str(1, request.pod_id) + nriwire.field_str(2, "pod") + nriwire.field_str(4, "default")
    container = nriwire.field_str(1, request.container_id) + nriwire.field_str(3, name)
    body = nriwire.field_bytes(1, pod_msg) + nriwire.field_bytes(2, container)
    return Call(nriwire.PLUGIN_SERVICE, "CreateContainer", body)


def test_the_answers(node: Path, tree: Tree, capsys: pytest.CaptureFixture[str]) -> None:
    session = nri.Session(_launch(node, tree))
    configure = Call(nriwire.PLUGIN_SERVICE, "Configure", nriwire.field_str(2, "containerd"))
    assert session.answer(configure) == Reply(b"\x10\x08")
    assert session.answer(Call(nriwire.PLUGIN_SERVICE, "Synchronize", b"")) == Reply()
    more = nriwire.field_varint(3, 1)
    assert session.answer(Call(nriwire.PLUGIN_SERVICE, "Synchronize", more)) == Reply(b"\x10\x01")
    rdma = session.answer(_create(POD_A))
    assert rdma == Reply(nriwire.create_container_response([Device(f"{UVERBS}3", 231, 195), RDMA_CM], 64 << 20))
    assert session.answer(_create(POD_PLAIN)) == Reply()
    assert session.answer(Call(nriwire.PLUGIN_SERVICE, "StopContainer", b"")).code == nriwire.UNIMPLEMENTED
    assert session.answer(Call("other.Service", "CreateContainer", b"")).code == nriwire.UNIMPLEMENTED
    assert len(session.durations) == 2
    err = capsys.readouterr().err
    assert "container main (ctr-main) of pod default/pod: /dev/infiniband/uverbs3, /dev/infiniband/rdma_cm" in err
    assert "memlock 67108864 bytes" in err


def test_a_failure_leaves_the_container_unchanged_and_says_so(
    node: Path, tree: Tree, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(rdmaaccess, "for_pod", broken)
    assert nri.Session(_launch(node, tree)).answer(_create(POD_A)) == Reply()
    err = capsys.readouterr().err
    assert "cannot adjust container main (ctr-main) of pod default/pod: [Errno 5] Input/output error" in err
    assert "it is created unchanged" in err


class _Runtime:
    """A stand-in runtime on ``path``: takes the plugin's registration, then makes the calls given."""

    def __init__(self, path: str, calls: list[Call], registration: Reply | None = None) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.calls = calls
        self.registration = Reply() if registration is None else registration
        self.registered: Call | None = None
        self.replies: list[Reply] = []
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _receive(self, conn: socket.socket, trunk: Trunk) -> nriwire.Message:
        while True:
            data = conn.recv(65536)
            assert data, "the plugin closed the connection"
            messages = list(trunk.feed(data))
            if messages:
                (message,) = messages
                return message

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            trunk = Trunk()
            register = self._receive(conn, trunk)
            assert (register.conn, register.stream, register.kind) == (nriwire.RUNTIME_CONN, 1, nriwire.REQUEST)
            self.registered = Call.decode(register.body)
            conn.sendall(nriwire.frame(nriwire.RUNTIME_CONN, 1, nriwire.RESPONSE, self.registration.encode()))
            for stream, call in enumerate(self.calls):
                conn.sendall(nriwire.frame(nriwire.PLUGIN_CONN, 2 * stream + 1, nriwire.REQUEST, call.encode()))
                reply = self._receive(conn, trunk)
                assert (reply.conn, reply.stream, reply.kind) == (nriwire.PLUGIN_CONN, 2 * stream + 1, nriwire.RESPONSE)
                self.replies.append(Reply.decode(reply.body))


@pytest.fixture
def alive() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    try:
        os.close(w)
    except OSError:
        pass


def test_a_session_registers_answers_and_ends_when_the_runtime_closes(
    node: Path, tree: Tree, tmp_path: Path, alive: tuple[int, int]
) -> None:
    path = str(tmp_path / "nri.sock")
    configure = Call(nriwire.PLUGIN_SERVICE, "Configure", nriwire.field_str(2, "containerd"))
    runtime = _Runtime(path, [configure, _create(POD_A), _create(POD_PLAIN)])
    nri.Session(_launch(node, tree, path)).run(alive[0])  # returns once the runtime closed
    runtime.thread.join(10)
    runtime.listener.close()
    assert runtime.registered == Call(
        nriwire.RUNTIME_SERVICE, "RegisterPlugin", nriwire.register_plugin("sriov-cni", "10")
    )
    assert [r.code for r in runtime.replies] == [0, 0, 0]
    assert runtime.replies[1].payload.startswith(b"\x0a")  # an adjustment
    assert runtime.replies[2].payload == b""


def test_a_refused_registration_ends_the_session_saying_why(
    node: Path, tree: Tree, tmp_path: Path, alive: tuple[int, int]
) -> None:
    path = str(tmp_path / "nri.sock")
    runtime = _Runtime(path, [], Reply(code=9, message="plugin sriov-cni not allowed"))
    session = nri.Session(_launch(node, tree, path))
    with pytest.raises(nriwire.WireError, match="refused the registration: plugin sriov-cni not allowed"):
        session.run(alive[0])
    assert not session.registered
    runtime.thread.join(10)
    runtime.listener.close()


def test_a_session_ends_when_the_daemon_does(node: Path, tree: Tree, tmp_path: Path, alive: tuple[int, int]) -> None:
    path = str(tmp_path / "nri.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    os.close(alive[1])  # the daemon ended
    nri.Session(_launch(node, tree, path)).run(alive[0])
    listener.close()


def test_summary() -> None:
    assert nri.summary([0.001, 0.002, 0.003]) == "3 calls, p50 2.00 ms, p99 3.00 ms"


def test_the_plugin_registers_again_after_the_runtime_restarts_and_ends_with_the_daemon(
    node: Path, tree: Tree, tmp_path: Path, alive: tuple[int, int]
) -> None:
    path = str(tmp_path / "nri.sock")
    plugin = threading.Thread(target=nri._run, args=(_launch(node, tree, path, retry=0.05), alive[0]))
    plugin.start()  # no socket yet: it waits for one
    for _ in range(2):  # the runtime, then the runtime restarted
        runtime = _Runtime(path, [_create(POD_A)])
        runtime.thread.join(10)
        runtime.listener.close()
        os.unlink(path)
        assert runtime.registered is not None and runtime.replies[0].payload
    os.close(alive[1])  # the daemon ends
    plugin.join(10)
    assert not plugin.is_alive()


def test_the_daemon_runs_the_plugin_unless_told_not_to(node: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    runtime = _Runtime(path, [_create(POD_A), _create(POD_PLAIN)])
    # Its records are of pods without namespaces: not the healing's to give back.
    with Daemon(tmp_path / "run", "--data-dir", str(node), "--nri-socket", path, "--no-heal") as daemon:
        assert f"NRI plugin for {path}" in daemon.banner
        runtime.thread.join(30)
    runtime.listener.close()
    assert runtime.registered is not None
    # The daemon reads the node's own sysfs, which has none of pod A's
    # devices (rdma_cm when rdma_ucm is loaded): its limit at least.
    expected = rdmaaccess.for_pod(POD_A, node, Path("/sys"))
    assert expected is not None and expected.memlock == 64 << 20
    assert runtime.replies[0] == Reply(nriwire.create_container_response(list(expected.devices), expected.memlock))
    assert runtime.replies[1] == Reply()
    with Daemon(tmp_path / "run2", "--data-dir", str(node), "--nri-socket", path, "--no-nri") as daemon:
        assert "NRI plugin" not in daemon.banner
