"""The daemon as Kubernetes runs it: its readiness probe (``sriov-cni ready``) and its stop (SIGTERM).

Each test runs the real daemon, or something in its place on its socket
(nothing, a listener that never answers, a daemon whose children cannot
start), and the probe as the DaemonSet's readinessProbe runs it: the
command, its exit status and what it prints.  A stopping daemon is sent
SIGTERM, as the runtime sends it, with a call in flight through the shim.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.daemonlib import (
    REPO,
    SHIM,
    Daemon,
    broken_children,
    command_line,
    ipam_conf,
    ipam_env,
    shim,
    wait_for,
)


def ready(socket_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    # The subprocess timeout only keeps a probe that ignores its own from
    # hanging the suite.
    return subprocess.run(
        command_line(socket_path, *options, command="ready"), cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_ready_when_the_daemon_runs_a_call(tmp_path: Path) -> None:
    # One call per child: the child that ran the probe's call ends after it.
    d = Daemon(tmp_path / "run", "--calls-per-child", "1")
    try:
        wait_for(lambda: len(d.all_children()) == 2)
        spares = set(d.all_children())
        proc = ready(d.socket)
        assert proc.returncode == 0, proc
        assert f"the daemon at {d.socket} ran a call" in proc.stdout
        wait_for(lambda: not spares <= set(d.all_children()))
    finally:
        d.stop()


def test_ready_loads_neither_the_daemon_nor_the_node_modules(tmp_path: Path) -> None:
    # The kubelet runs the probe every 20 s; pyroute2, prometheus_client and
    # yaml, which only the other commands use, would be most of its CPU.  The
    # same process then loads the daemon and the node config, so a check that
    # could not see them there fails too.
    code = (
        "import sys\n"
        "from sriov_cni.cli import main\n"
        "def loaded(): return sorted(m for m in ('pyroute2', 'prometheus_client', 'yaml') if m in sys.modules)\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print(loaded())\n"
        "    import sriov_cni.daemon.server, sriov_cni.node.config\n"
        "    print(loaded())\n"
    )
    with Daemon(tmp_path / "run") as d:
        proc = subprocess.run(
            [sys.executable, "-c", code, "ready", "--socket", str(d.socket)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 0, proc
    assert proc.stdout.splitlines() == [
        f"ready: the daemon at {d.socket} ran a call and answered",
        "[]",
        "['prometheus_client', 'pyroute2', 'yaml']",
    ], proc


def test_not_ready_without_a_socket(tmp_path: Path) -> None:
    sock = tmp_path / "plugin.sock"
    proc = ready(sock)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert f"not ready: no daemon answers at {sock}: No such file or directory" in proc.stderr


@pytest.mark.parametrize(
    "listening, says",
    [
        # What a daemon that died leaves behind.
        (False, "not ready: no daemon answers at {sock}: Connection refused"),
        # It takes the connection and the request, and never answers: a stuck daemon.
        (True, "not ready: the daemon at {sock} did not answer within 0.5 s"),
    ],
)
def test_not_ready_when_the_socket_answers_nothing(tmp_path: Path, listening: bool, says: str) -> None:
    sock = tmp_path / "plugin.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(sock))
    if listening:
        bound.listen(8)
    try:
        proc = ready(sock, "--timeout", "0.5")
    finally:
        bound.close()
    assert proc.returncode == 1, proc
    assert says.format(sock=sock) in proc.stderr


def test_not_ready_while_the_daemons_children_cannot_start(tmp_path: Path) -> None:
    # The socket answers, but no child can run a call: a probe that only
    # connected would call this ready.
    d = Daemon(tmp_path / "run", wrapper=broken_children(tmp_path))
    assert d.proc.stderr is not None
    try:
        wait_for(lambda: "ended before it could take calls" in d.proc.stderr.readline())  # type: ignore[union-attr]
        proc = ready(d.socket)
        assert proc.returncode == 1, proc
        assert "refused the call: the sriov-cni daemon's children end before they can take calls" in proc.stderr
    finally:
        d.stop()


def slow_call(d: Daemon, tmp_path: Path, container: str) -> subprocess.Popen[bytes]:
    """An ADD through the shim that runs in a child until its stdin, held open here, gets the config."""
    link = tmp_path / "bin" / "sriov-ipam"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(SHIM)
    env = {"CNI_COMMAND": "ADD", "SRIOV_CNI_SOCKET": str(d.socket), **ipam_env(container)}
    proc = subprocess.Popen([str(link)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    wait_for(lambda: d.children())
    return proc


def said(d: Daemon, text: str) -> str:
    """The daemon's next line of stderr holding ``text`` (its log, as kubelet keeps it)."""
    assert d.proc.stderr is not None
    for line in iter(d.proc.stderr.readline, ""):
        if text in line:
            return line
    raise AssertionError(f"the daemon ended without saying {text!r}")


@pytest.fixture
def stopping(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Daemons a test stops itself; any still running afterwards is killed."""
    started: list[Daemon] = []

    def start(*options: str) -> Daemon:
        started.append(Daemon(tmp_path / "run", *options))
        return started[-1]

    yield start
    for d in started:
        d.proc.kill()
        d.proc.wait(timeout=60)
        assert d.proc.stderr is not None
        d.proc.stderr.close()


def test_sigterm_lets_the_call_in_flight_end_refuses_new_ones_and_exits_0(
    stopping: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The request timeout bounds how long the child reads the slow call's
    # stdin: longer than this test holds it open on a loaded machine.
    d = stopping("--request-timeout", "120")
    conf = ipam_conf(tmp_path)
    slow = slow_call(d, tmp_path, "slow")
    assert slow.stdin is not None
    d.proc.send_signal(signal.SIGTERM)
    assert "new calls are refused, 1 running" in said(d, "stopping")

    rc, out = shim(d.socket, "ADD", conf, name="sriov-ipam", env=ipam_env("late"))
    assert rc == 1 and out["code"] == 11, out
    assert out["msg"] == "the sriov-cni daemon is stopping; nothing ran"
    probe = ready(d.socket)
    assert probe.returncode == 1 and "refused the call: the sriov-cni daemon is stopping" in probe.stderr
    assert d.proc.poll() is None, "the daemon waits for the call in flight"

    slow.stdin.write(conf)
    slow.stdin.close()
    assert slow.stdout is not None
    out_bytes = slow.stdout.read()
    slow.stdout.close()
    assert slow.wait(timeout=60) == 0, out_bytes
    address = json.loads(out_bytes)["ips"][0]["address"].split("/")[0]
    assert d.proc.wait(timeout=60) == 0
    assert "stopped, no call running" in said(d, "stopped")
    # The refused call left nothing: the only lease is the slow call's.
    assert [p.name for p in (tmp_path / "ipam").rglob("10.77.0.*")] == [address]


def test_sigterm_with_a_call_running_past_the_drain_timeout_exits_1_naming_it(
    stopping: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = stopping("--request-timeout", "120", "--drain-timeout", "0.5")
    slow = slow_call(d, tmp_path, "stuck")
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=60) == 1
    assert "stopped 0.5 s after SIGTERM with 1 calls still running" in said(d, "Error")
    # Its child outlived the daemon, as an executed plugin outlives its
    # runtime; killing the shim ends it (the runtime giving up).
    slow.kill()
    slow.communicate(timeout=60)
