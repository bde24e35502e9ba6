"""The daemon's NRI plugin: gives each container of a pod with an RDMA attachment its devices and memlock limit.

containerd 2.x and CRI-O run NRI by default and listen on
``/var/run/nri/nri.sock``.  A process of its own, forked when the daemon
starts (:func:`start`) and ending with it, connects there as a plugin,
registers, subscribes to CreateContainer and answers each with
:mod:`rdmaaccess`'s devices and limit for the container's pod, or with no
adjustment for any other pod.  It is not the daemon's loop: the runtime
waits on each answer (up to its request timeout, 2 s by default), and a
call handed to the daemon's children must not queue behind it, nor it
behind them.

While the socket is absent (no runtime with NRI yet, or NRI off), and
after the runtime closed the connection (it restarted), the process looks
again every :data:`RETRY` seconds and registers anew.  A daemon restart
starts a new process, which registers again.  The runtime bounds every
call by its own timeout: an answer later than that is dropped, and the
container is created without it.  A failure to read the pod's records or
devices is logged and answered with no adjustment: the container is then
created unchanged (its RDMA device unusable, as without this plugin), not
refused.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sriov_cni.daemon import budget, nriwire, rdmaaccess
from sriov_cni.daemon.nriwire import Call, Configure, NewContainer, Reply, WireError
from sriov_cni.kernel import lifetime

# How the plugin is known to the runtime; the index orders the plugins'
# calls (two digits).
PLUGIN_NAME = "sriov-cni"
PLUGIN_INDEX = "10"
# The plugin's process's name (comm).
PROCESS_NAME = "sriov-cni-nri"
# Seconds between looks for the runtime's socket, and between connections.
RETRY = 5.0
# Seconds a connection to the socket, or a send on it, may take.
SOCKET_TIMEOUT = 5.0
# CreateContainer calls whose durations a session keeps for its log line.
KEPT_DURATIONS = 1000


@dataclass(frozen=True)
class Launch:
    """Where the plugin connects, the store and sysfs it reads, and the OOM score it runs at."""

    socket: str
    data_dir: Path
    sys_root: Path
    # The daemon's oom_score_adj before it protected itself.
    score: int | None
    # Seconds between looks for the runtime's socket, and between connections.
    retry: float = RETRY


def start(launch: Launch) -> int:
    """Fork the plugin's process; the daemon's end of its alive pipe, to hold as long as the daemon lives.

    Forked twice, as the metrics exporter is: the daemon reaps every child
    it has as a call's.
    """
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the first fork, which only forks again
        try:
            if os.fork() == 0:
                lifetime.leave_daemon({0, 1, 2, alive_r})
                # Its command line is the daemon's: its name tells it apart.
                lifetime.set_name(PROCESS_NAME)
                budget.unprotect(launch.score)
                _run(launch, alive_r)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(alive_r)
    return alive_w


def _say(text: str) -> None:
    sys.stderr.write(f"sriov-cni daemon: nri: {text}\n")
    sys.stderr.flush()


def _run(launch: Launch, alive: int) -> None:
    logging.basicConfig(stream=sys.stderr, format="sriov-cni daemon: nri: %(message)s", level=logging.INFO)
    # Said once while it lasts: a socket a stopped runtime left refuses
    # every RETRY seconds.
    last_failure = ""
    while True:
        if os.path.exists(launch.socket):
            session = Session(launch)
            try:
                session.run(alive)
                last_failure = ""
            except Exception as exc:  # whatever broke the session, the next one starts afresh
                failure = f"connection to {launch.socket} lost: {exc}"
                if failure != last_failure or session.registered:
                    _say(f"{failure}; connecting again every {launch.retry:g} s")
                last_failure = failure
        # Until the daemon ends: its end of the pipe closes then.
        ready, _, _ = select.select([alive], [], [], launch.retry)
        if ready:
            return


class Session:
    """One connection to the runtime: register, then answer its calls until it closes."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.trunk = nriwire.Trunk()
        self.durations: list[float] = []
        self.sock: socket.socket | None = None
        self.registered = False

    def run(self, alive: int) -> None:
        """Serve until the runtime closes the connection, or the daemon ends (``alive`` readable)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock = sock
        try:
            # Also bounds each answer's send: a runtime that stopped reading
            # ends the session, not the plugin.
            sock.settimeout(SOCKET_TIMEOUT)
            sock.connect(self.launch.socket)
            register = Call(
                nriwire.RUNTIME_SERVICE, "RegisterPlugin", nriwire.register_plugin(PLUGIN_NAME, PLUGIN_INDEX)
            )
            self._send(nriwire.frame(nriwire.RUNTIME_CONN, 1, nriwire.REQUEST, register.encode()))
            while True:
                ready, _, _ = select.select([sock.fileno(), alive], [], [])
                if alive in ready:
                    return
                data = sock.recv(1 << 16)
                if not data:
                    _say(f"the runtime closed the connection; connecting again in {self.launch.retry:g} s")
                    return
                for message in self.trunk.feed(data):
                    self.on_message(message)
        finally:
            sock.close()
            if self.durations:
                _say(f"session's CreateContainer answers: {summary(self.durations)}")

    def _send(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(data)

    def on_message(self, message: nriwire.Message) -> None:
        if message.conn == nriwire.RUNTIME_CONN and message.kind == nriwire.RESPONSE:
            reply = Reply.decode(message.body)
            if reply.code != nriwire.OK:
                raise WireError(f"the runtime refused the registration: {reply.message} (code {reply.code})")
            self.registered = True
            return
        if message.conn != nriwire.PLUGIN_CONN or message.kind != nriwire.REQUEST:
            return  # nothing else is sent to a plugin that streams nothing
        call = Call.decode(message.body)
        reply = self.answer(call)
        self._send(nriwire.frame(nriwire.PLUGIN_CONN, message.stream, nriwire.RESPONSE, reply.encode()))

    def answer(self, call: Call) -> Reply:
        """The reply to one of the runtime's calls on the Plugin service."""
        if call.service != nriwire.PLUGIN_SERVICE:
            return Reply(code=nriwire.UNIMPLEMENTED, message=f"no service {call.service}")
        if call.method == "Configure":
            conf = Configure.decode(call.payload)
            _say(
                f"registered with {conf.runtime_name} {conf.runtime_version} on {self.launch.socket} "
                f"(request timeout {conf.request_timeout_ms} ms): adds RDMA devices and memlock to RDMA pods"
            )
            return Reply(nriwire.configure_response(nriwire.CREATE_CONTAINER))
        if call.method == "CreateContainer":
            return Reply(self.create_container(NewContainer.decode(call.payload)))
        if call.method == "Synchronize":
            # Nothing to change in containers that exist: they were
            # created with their devices, or before this plugin ran.
            return Reply(nriwire.synchronize_response(call.payload))
        if call.method in ("Shutdown", "StateChange"):
            return Reply()
        return Reply(code=nriwire.UNIMPLEMENTED, message=f"{PLUGIN_NAME} does not serve {call.method}")

    def create_container(self, new: NewContainer) -> bytes:
        """CreateContainer's answer for ``new``: its pod's devices and limit, nothing for any other pod."""
        started = time.perf_counter()
        who = f"container {new.container_name} ({new.container_id[:12]}) of pod {new.pod_namespace}/{new.pod_name}"
        try:
            access = rdmaaccess.for_pod(new.pod_id, self.launch.data_dir, self.launch.sys_root)
        except Exception as exc:  # a broken record or sysfs read: the container goes on as it is
            self._took(started)
            _say(f"cannot adjust {who}: {exc}; it is created unchanged")
            return b""
        answer = b"" if access is None else nriwire.create_container_response(list(access.devices), access.memlock)
        took = self._took(started)
        if access is not None:
            memlock = "unlimited" if access.memlock is None else f"{access.memlock} bytes"
            devices = ", ".join(d.path for d in access.devices) or "no device"
            _say(f"{who}: {devices}, memlock {memlock} ({took * 1000:.2f} ms)")
        return answer

    def _took(self, started: float) -> float:
        took = time.perf_counter() - started
        if len(self.durations) < KEPT_DURATIONS:
            self.durations.append(took)
        return took


def summary(durations: list[float]) -> str:
    """``n``, p50 and p99 of ``durations`` (seconds), in milliseconds."""
    ordered = sorted(durations)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{len(ordered)} calls, p50 {statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"
