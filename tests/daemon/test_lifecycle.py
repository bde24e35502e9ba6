"""The daemon as Kubernetes runs it: its readiness probe (``sriov-cni ready``).

Each test runs the real daemon, or something in its place on its socket
(nothing, a listener that never answers, a daemon whose children cannot
start), and the probe as the DaemonSet's readinessProbe runs it: the
command, its exit status and what it prints.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from daemonlib import REPO, Daemon, wait_for


def ready(socket_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    # The subprocess timeout only keeps a probe that ignores its own from
    # hanging the suite.
    return subprocess.run([sys.executable, "-c", "from sriov_cni.cli import main; main()", "ready",
                           "--socket", str(socket_path), *options],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


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


def test_not_ready_without_a_socket(tmp_path: Path) -> None:
    sock = tmp_path / "plugin.sock"
    proc = ready(sock)
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert f"not ready: no daemon answers at {sock}: No such file or directory" in proc.stderr


def test_not_ready_when_nothing_listens(tmp_path: Path) -> None:
    sock = tmp_path / "plugin.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(sock))  # what a daemon that died leaves behind
    try:
        proc = ready(sock)
    finally:
        bound.close()
    assert proc.returncode == 1, proc
    assert f"no daemon answers at {sock}: Connection refused" in proc.stderr


def test_not_ready_when_the_daemon_answers_nothing_within_the_timeout(tmp_path: Path) -> None:
    sock = tmp_path / "plugin.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(8)  # connects and takes the request, never answers: a stuck daemon
    try:
        proc = ready(sock, "--timeout", "0.5")
    finally:
        listener.close()
    assert proc.returncode == 1, proc
    assert f"not ready: the daemon at {sock} did not answer within 0.5 s" in proc.stderr


def test_not_ready_while_the_daemons_children_cannot_start(tmp_path: Path) -> None:
    # The socket answers, but no child can run a call (each fails as it
    # opens /dev/null, made a read-only file in the daemon's mount
    # namespace): a probe that only connected would call this ready.
    null = tmp_path / "null"
    null.write_bytes(b"")
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind -o ro "$0" /dev/null && exec "$@"', str(null)]
    d = Daemon(tmp_path / "run", wrapper=wrapper)
    assert d.proc.stderr is not None
    try:
        wait_for(lambda: "ended before it could take calls" in d.proc.stderr.readline())  # type: ignore[union-attr]
        proc = ready(d.socket)
        assert proc.returncode == 1, proc
        assert "refused the call: the sriov-cni daemon's children end before they can take calls" in proc.stderr
    finally:
        d.stop()
