"""The daemon and the node command change only directories they own.

The socket's directory is made private only when it holds nothing but the
socket; an existing directory holding others' files keeps its mode (making
``/run`` 0700 would cut every other user off it); a directory others can
write is refused, naming it.  The same rule holds for ``install-cni``'s
destination and ``setup``'s state file.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sriov_cni import nodestate
from sriov_cni.cni import CNIError
from tests.support.daemonlib import REPO, Daemon, shim


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from sriov_cni.cli import main; main()", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_new_socket_directory_is_root_only(tmp_path: Path) -> None:
    run = tmp_path / "new" / "run"
    d = Daemon(run)
    try:
        assert _mode(run) == 0o700
        assert _mode(d.socket) == 0o600
    finally:
        d.stop()


@pytest.mark.parametrize("leftover", [False, True], ids=["empty", "an-earlier-socket"])
def test_a_socket_directory_holding_only_the_socket_is_made_root_only(tmp_path: Path, leftover: bool) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o755)
    if leftover:
        first = Daemon(run)
        first.stop()
        run.chmod(0o755)
        assert [p.name for p in run.iterdir()] == ["plugin.sock"]
    d = Daemon(run)
    try:
        assert _mode(run) == 0o700
    finally:
        d.stop()


def test_a_socket_directory_holding_other_files_keeps_its_mode(tmp_path: Path) -> None:
    # As /run: others' files, readable by everyone, writable only by root.
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o755)
    (run / "resolv.conf").write_text("nameserver 127.0.0.53\n")
    d = Daemon(run)
    try:
        assert _mode(run) == 0o755
        assert _mode(d.socket) == 0o600
        rc, out = shim(d.socket, "VERSION", b'{"cniVersion": "1.0.0"}')
        assert rc == 0 and "supportedVersions" in out, out
    finally:
        d.stop()


@pytest.mark.parametrize("mode", [0o1777, 0o775, 0o757], ids=["sticky", "group-writable", "world-writable"])
def test_a_socket_directory_others_can_write_is_refused_by_name(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    proc = _cli("daemon", "--socket", str(shared / "plugin.sock"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"socket directory {shared} is writable by others" in proc.stderr, proc.stderr
    assert _mode(shared) == mode
    assert not (shared / "plugin.sock").exists()


def test_a_socket_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    proc = _cli("daemon", "--socket", str(theirs / "plugin.sock"))
    assert proc.returncode == 1 and f"socket directory {theirs}" in proc.stderr, proc.stderr
    assert "owner uid 65534" in proc.stderr


def test_install_cni_refuses_a_destination_others_can_write(tmp_path: Path) -> None:
    dest = tmp_path / "cni-bin"
    dest.mkdir()
    dest.chmod(0o777)
    proc = _cli("install-cni", "--dest", str(dest))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"CNI plugin directory {dest} is writable by others" in proc.stderr
    assert list(dest.iterdir()) == []
    assert _mode(dest) == 0o777


def test_install_cni_leaves_an_existing_destination_mode_alone(tmp_path: Path) -> None:
    dest = tmp_path / "cni-bin"
    dest.mkdir()
    dest.chmod(0o711)
    proc = _cli("install-cni", "--dest", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert _mode(dest) == 0o711


def test_install_cni_creates_a_missing_destination_readable_by_all(tmp_path: Path) -> None:
    dest = tmp_path / "opt" / "cni" / "bin"
    proc = _cli("install-cni", "--dest", str(dest), "--create-dest")
    assert proc.returncode == 0, proc.stderr
    assert _mode(dest) == 0o755


def test_the_state_file_is_not_written_where_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(CNIError, match=f"state file directory {shared} is writable by others"):
        nodestate.write_state(shared / "node.json", {})
    assert list(shared.iterdir()) == []


def test_the_state_file_leaves_its_existing_directory_mode_alone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o700)
    nodestate.write_state(run / "node.json", {"pfs": {}})
    assert _mode(run) == 0o700
    assert nodestate.read_state(run / "node.json") is not None
    fresh = tmp_path / "fresh" / "sriov-cni"
    nodestate.write_state(fresh / "node.json", {"pfs": {}})
    assert _mode(fresh) == 0o755 and _mode(fresh / "node.json") == 0o644
