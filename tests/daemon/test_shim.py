"""The static shim against a real daemon process on a temporary socket.

Everything runs for real: the daemon is ``sriov-cni daemon`` in its own
process, the shim is the binary ``make -C shim`` built, and the calls that
run a plugin run ``sriov-ipam`` (the plugin half that needs no SR-IOV NIC)
with its store in the test's directory.
"""

from __future__ import annotations

import json
import os
import pstats
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from sriov_cni import __version__, wire
from sriov_cni.daemon import childpool, install, measure
from tests.support import hangipam
from tests.support.daemonlib import REPO, SHIM, Daemon, ipam_conf, ipam_env, shim, wait_for

PT_INTERP = 3


def test_the_shim_is_a_static_executable() -> None:
    data = SHIM.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, "a 64-bit ELF file"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)]
    assert types and PT_INTERP not in types, "a program interpreter means shared libraries"
    ldd = subprocess.run(["ldd", str(SHIM)], capture_output=True, text=True)
    assert "not a dynamic executable" in ldd.stdout + ldd.stderr


def test_calls_run_through_the_daemon_as_sriov_ipam(daemon: Daemon, tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path)
    rc, out = shim(daemon.socket, "ADD", conf, name="sriov-ipam", env=ipam_env("c1"))
    assert rc == 0, out
    assert out["ips"][0]["address"].startswith("10.77.0."), out
    leases = [p.name for p in (tmp_path / "ipam").rglob("10.77.0.*")]
    assert leases == [out["ips"][0]["address"].split("/")[0]]
    rc, out = shim(daemon.socket, "DEL", conf, name="sriov-ipam", env=ipam_env("c1"))
    assert (rc, out) == (0, {})
    assert not list((tmp_path / "ipam").rglob("10.77.0.*"))
    rc, out = shim(daemon.socket, "VERSION", b'{"cniVersion": "1.0.0"}')
    assert rc == 0 and "1.0.0" in out["supportedVersions"], out


def test_version_skew_is_refused_naming_both_versions(daemon: Daemon, tmp_path: Path) -> None:
    other = tmp_path / "old-shim"
    subprocess.run(
        ["gcc", "-O2", "-static", '-DSHIM_VERSION="0.0.9-old"', "-o", str(other), str(REPO / "shim" / "sriov-shim.c")],
        check=True,
    )
    rc, out = shim(daemon.socket, "ADD", ipam_conf(tmp_path), exe=other, name="sriov-ipam", env=ipam_env("skew"))
    assert rc == 1 and out["code"] == 11, out
    assert "0.0.9-old" in out["msg"] and __version__ in out["msg"]
    assert not (tmp_path / "ipam").exists(), "nothing ran"


def raw_request(sock: Path, header: bytes) -> bytes:
    """Send a request the shim would never send; the daemon's whole answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    r, w = os.pipe()
    try:
        conn.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", r, w, w))])
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
        return answer
    finally:
        conn.close()
        os.close(r)
        os.close(w)


def test_a_request_sent_in_one_piece_is_served(daemon: Daemon, tmp_path: Path) -> None:
    # The shim and the Python client send the length alone, then the rest;
    # a client may as well send length, request and descriptors in one
    # message, and the daemon must not read past the length.
    frame = wire.encode_request(__version__, "sriov", "/", {"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin"})
    stdin = tmp_path / "stdin.json"
    stdin.write_text('{"cniVersion": "1.0.0"}')
    r, w = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with stdin.open("rb") as f:
            conn.connect(str(daemon.socket))
            conn.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", f.fileno(), w, w))])
        os.close(w)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
        with os.fdopen(r, "rb") as out:
            printed = out.read()
    finally:
        conn.close()
    assert answer == wire.exited(0), answer
    assert "1.1.0" in json.loads(printed)["supportedVersions"], printed


def test_daemon_refuses_an_oversized_request_without_reading_it(daemon: Daemon) -> None:
    answer = raw_request(daemon.socket, struct.pack("!I", wire.MAX_REQUEST + 1))
    assert answer[0] == wire.REFUSED
    out = json.loads(answer[1:])
    assert out["code"] == 4 and str(wire.MAX_REQUEST + 1) in out["msg"], out


def test_a_stalled_request_is_dropped_after_the_timeout(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "run", "--request-timeout", "0.5")
    try:
        # The length promises 100 bytes that never come.
        answer = raw_request(d.socket, struct.pack("!I", 100))
    finally:
        d.stop()
    assert answer[0] == wire.REFUSED
    out = json.loads(answer[1:])
    assert out["code"] == 11 and "no complete request within 0.5 s" in out["msg"], out


def test_a_call_and_its_ipam_end_when_the_shim_is_killed(daemon: Daemon, tmp_path: Path) -> None:
    # What a runtime does to a call it gave up on: it kills the executable
    # it ran.  The call must end with it, as an executed plugin would, and
    # so must its delegated IPAM: a DEL finishing later, beside the
    # runtime's next ADD for the same pod, would release the new address.
    bin_dir = tmp_path / "cni-bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "ipam.pid"
    conf = json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "n",
            "type": "sriov",
            "dataDir": str(tmp_path / "state"),
            "ipam": {"type": hangipam.install(bin_dir, pid_file)},
        }
    )
    link = tmp_path / "bin" / "sriov"
    link.parent.mkdir()
    link.symlink_to(SHIM)
    env = {
        "CNI_COMMAND": "DEL",
        "SRIOV_CNI_SOCKET": str(daemon.socket),
        "CNI_CONTAINERID": "abandoned",
        "CNI_NETNS": str(tmp_path / "gone"),
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bin_dir),
    }
    proc = subprocess.Popen([str(link)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(conf.encode())
    proc.stdin.close()
    ipam = hangipam.started(pid_file)
    child = daemon.children()[0]
    assert not hangipam.ended(ipam) and not hangipam.ended(child)
    proc.kill()
    proc.wait(timeout=60)
    proc.stdout.close()
    wait_for(lambda: hangipam.ended(child) and hangipam.ended(ipam))
    rc, out = shim(daemon.socket, "VERSION", b'{"cniVersion": "1.0.0"}')
    assert rc == 0, out


def test_at_most_max_children_calls_run_at_once(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "run", "--max-children", "1")
    env = {"CNI_COMMAND": "VERSION", "SRIOV_CNI_SOCKET": str(d.socket)}
    version = tmp_path / "version.json"
    version.write_text('{"cniVersion": "1.0.0"}')
    try:
        link = tmp_path / "bin" / "sriov"
        link.parent.mkdir()
        link.symlink_to(SHIM)
        first = subprocess.Popen([str(link)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        busy = wait_for(lambda: d.children())
        with version.open("rb") as stdin:
            second = subprocess.Popen([str(link)], stdin=stdin, stdout=subprocess.PIPE, env=env)
        # The second shim waits for its answer, and the daemon forks no
        # spare to take it while its one child runs the first call.
        wait_for(lambda: Path(f"/proc/{second.pid}/wchan").read_text() == "unix_stream_read_generic")
        wait_for(lambda: "poll" in Path(f"/proc/{d.proc.pid}/wchan").read_text())
        assert d.all_children() == busy and second.poll() is None
        first_out, _ = first.communicate(b'{"cniVersion": "1.0.0"}', timeout=60)
        second_out, _ = second.communicate(timeout=60)
    finally:
        d.stop()
    assert first.returncode == 0, first_out
    assert second.returncode == 0, second_out


def test_install_cni_writes_the_shim_atomically_as_both_executables(tmp_path: Path) -> None:
    dest = tmp_path / "cni-bin"
    dest.mkdir()
    (dest / "sriov").write_text("an older plugin\n")
    proc = subprocess.run(
        [sys.executable, "-c", "from sriov_cni.cli import main; main()", "install-cni", "--dest", str(dest)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    # The older plugin is not ours: kept as sriov.orig (tests/daemon/test_install_cni.py).
    assert sorted(p.name for p in dest.iterdir()) == ["sriov", "sriov-ipam", "sriov.orig"], "no temporary files left"
    assert (dest / "sriov.orig").read_text() == "an older plugin\n"
    for name in ("sriov", "sriov-ipam"):
        path = dest / name
        assert path.read_bytes() == SHIM.read_bytes()
        assert stat.S_IMODE(path.stat().st_mode) == 0o755


def test_install_cni_python_scripts_run_this_installation(tmp_path: Path) -> None:
    # The scripts put the directory holding this sriov_cni package first on
    # their path; run without PYTHONPATH from elsewhere, they must still
    # import this tree and answer.
    dest = tmp_path / "cni-bin"
    written = install.install(str(dest), sys.executable)
    assert sorted(Path(p).name for p in written) == ["sriov", "sriov-ipam"]
    env = {"CNI_COMMAND": "VERSION", "SRIOV_CNI_SOCKET": str(tmp_path / "none.sock"), "PATH": "/usr/bin:/bin"}
    for path in written:
        assert f"sys.path.insert(0, {str(REPO)!r})" in Path(path).read_text()
        proc = subprocess.run(
            [path], input=b'{"cniVersion": "1.0.0"}', env=env, cwd=tmp_path, capture_output=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]


def run_python_sriov(
    sock: Path | None,
    version: str,
    plugin_importable: bool = True,
    command: str = "VERSION",
) -> subprocess.CompletedProcess[bytes]:
    """The Python ``sriov`` executable, claiming to be ``version``, told of ``sock`` by SRIOV_CNI_SOCKET.

    Without ``plugin_importable`` it can run nothing itself, so a call that
    succeeds was run by the daemon. ``sock`` None sets no socket variable.
    """
    block = "" if plugin_importable else "import sys; sys.modules['sriov_cni.plugin.commands'] = None; "
    code = (
        f"import sriov_cni; sriov_cni.__version__ = {version!r}; {block}"
        "from sriov_cni.daemon.client import main; main()"
    )
    env = {"CNI_COMMAND": command, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    if sock is not None:
        env["SRIOV_CNI_SOCKET"] = str(sock)
    return subprocess.run(
        [sys.executable, "-c", code], input=b'{"cniVersion": "1.0.0"}', env=env, capture_output=True, timeout=60
    )


def python_sriov(sock: Path | None, version: str, plugin_importable: bool = True) -> tuple[int, dict[str, Any]]:
    proc = run_python_sriov(sock, version, plugin_importable)
    return proc.returncode, json.loads(proc.stdout)


def test_python_client_hands_the_daemon_its_stderr(daemon: Daemon) -> None:
    # Without CNI_COMMAND the plugin describes itself on stderr: the
    # client's own, passed with stdin and stdout, not the connection.
    proc = run_python_sriov(daemon.socket, __version__, plugin_importable=False, command="")
    assert proc.returncode == 0 and proc.stdout == b"", proc
    assert b"CNI protocol versions supported: " in proc.stderr, proc


def test_python_client_without_a_socket_variable_still_answers() -> None:
    # It tries the default socket; whether a daemon listens there or not,
    # the call is answered, never a traceback.
    rc, out = python_sriov(None, __version__)
    assert rc == 0 and "1.1.0" in out["supportedVersions"], out


def test_python_client_runs_in_process_when_the_daemon_refuses(daemon: Daemon) -> None:
    # The daemon refuses another version with an error object; the Python
    # client does not print it but runs the call itself.
    rc, out = python_sriov(daemon.socket, "0.0.9-old")
    assert rc == 0 and "1.1.0" in out["supportedVersions"], out


def test_a_measuring_daemon_reports_each_call_after_answering(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    d = Daemon(tmp_path / "run", env={measure.STATS_ENV: str(stats), measure.PROFILE_ENV: "1"})
    try:
        conf = ipam_conf(tmp_path)
        rc, out = shim(d.socket, "ADD", conf, name="sriov-ipam", env=ipam_env("c1"))
        assert rc == 0 and out["ips"], out
        # Written after the answer: the child may still be at it.
        [report_file] = wait_for(lambda: list(stats.glob("*.json")))
    finally:
        d.stop()
    report = json.loads(report_file.read_text())
    assert report["program"] == "sriov-ipam" and report["command"] == "ADD" and report["container"] == "c1"
    assert report["status"] == 0 and report["seconds"] > 0
    # A forked child's peak starts at its own size, not the daemon's.
    assert 0 < report["private_kib"] <= report["maxrss_kib"]
    # sriov-ipam has its own store and takes no lock of the VF store.
    assert report["claims"] == []
    profile = pstats.Stats(str(stats / f"{report_file.stem}.prof"))
    assert any(func[2] == "_run_ipam" for func in profile.stats)  # type: ignore[attr-defined]


def test_a_failed_call_exits_non_zero_through_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    conf = json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "shim-bad",
            "type": "sriov",
            "ipam": {"type": "sriov-ipam", "dataDir": str(tmp_path / "ipam")},
        }
    ).encode()
    rc, out = shim(daemon.socket, "ADD", conf, name="sriov-ipam", env=ipam_env("bad"))
    assert rc == 1 and out["code"] == 7 and "msg" in out, out


def _served_by(stats: Path, calls: int) -> list[tuple[int, int]]:
    """(pid, call number in that child) of each measured call, in order."""
    wait_for(lambda: len(list(stats.glob("*.json"))) >= calls)
    served = []
    for f in stats.glob("*.json"):
        pid, call = f.stem.split("-")
        served.append((int(pid), int(call)))
    return sorted(served)


def test_a_child_serves_calls_in_turn_each_with_only_its_own_settings(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    d = Daemon(tmp_path / "run", "--max-children", "1", env={measure.STATS_ENV: str(stats)})
    link = tmp_path / "bin" / "sriov"
    link.parent.mkdir()
    link.symlink_to(SHIM)

    def delete(container: str, log_file: Path | None) -> str:
        conf = {
            "cniVersion": "1.0.0",
            "name": "n",
            "type": "sriov",
            "logLevel": "debug",
            "dataDir": str(tmp_path / "state"),
            **({"logFile": str(log_file)} if log_file else {}),
        }
        env = {
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": container,
            "CNI_NETNS": str(tmp_path / "gone"),
            "CNI_IFNAME": "net1",
            "CNI_PATH": "/opt/cni/bin",
            "SRIOV_CNI_SOCKET": str(d.socket),
        }
        proc = subprocess.run([str(link)], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=60)
        assert proc.returncode == 0, proc
        return proc.stderr.decode()

    def open_fds(pid: int) -> list[str]:
        # Once the child waits again (back in the daemon's process group).
        wait_for(lambda: not d.children())
        return sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))

    try:
        first = delete("c1", tmp_path / "one.log")
        [(child, _)] = _served_by(stats, 1)
        fds_after_one = open_fds(child)
        second = delete("c2", tmp_path / "two.log")
        third = delete("c3", None)
        served = _served_by(stats, 3)
        fds_after_three = open_fds(child)
    finally:
        d.stop()
    # One child served the three calls, one after another.
    assert served == [(child, 0), (child, 1), (child, 2)]
    # Each call logged where its own config said, and only there: the log
    # file of an earlier call is neither kept nor written to.
    one, two = (tmp_path / "one.log").read_text(), (tmp_path / "two.log").read_text()
    assert "containerID=c1" in one and "containerID=c2" not in one and "containerID=c3" not in one
    assert "containerID=c2" in two and "containerID=c3" not in two
    assert "containerID=c3" in third and not first and not second
    # Nothing of a call stays open in the child (its log file, the caller's
    # descriptors).
    assert not any(str(tmp_path) in fd for fd in fds_after_one)
    assert fds_after_three == fds_after_one


def test_a_child_that_served_a_call_ends_after_child_idle(tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    d = Daemon(tmp_path / "run", "--child-idle", "0.5", env={measure.STATS_ENV: str(stats)})
    try:
        rc, out = shim(d.socket, "VERSION", b'{"cniVersion": "1.0.0"}')
        assert rc == 0, out
        [(child, _)] = _served_by(stats, 1)
        # Gone from /proc once reaped (the daemon's list of children can
        # miss one while others are forked).
        wait_for(lambda: not Path(f"/proc/{child}").exists())
        # The daemon keeps its spares: fresh ones serve the next calls.
        wait_for(lambda: len(d.all_children()) == childpool.SPARES)
        rc, out = shim(d.socket, "VERSION", b'{"cniVersion": "1.0.0"}')
        assert rc == 0 and out["cniVersion"] == "1.0.0", out
    finally:
        d.stop()
    # Each call the first its child served: the first child did not serve
    # the second.  (Not a comparison of pids: a busy node wraps pid_max, and
    # a new child may even get a lower pid than the one that ended.)
    served = _served_by(stats, 2)
    assert child in {pid for pid, _ in served} and [n for _, n in served] == [0, 0], served
