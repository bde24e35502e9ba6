"""Both executables speak the frame of sriov_cni.wire, case for case.

The shim's compiled-in constants are read from its source and compared
with the module's.  Then one table of cases is played to the real static
shim and to the Python ``sriov`` executable as install-cni writes it: a
real daemon serving, refusing or dying in a call, no daemon or a stopped
one, and a stand-in daemon answering whatever bytes a row gives it.  Both
must answer alike (exit status and stdout, so the CNI error code too),
except where the Python executable runs the call in process by design
(nothing ran in the daemon): it must then answer as the plugin itself
does.  The stand-in also checks the request each sent: decoded by the
module, with the caller's stdin, stdout and stderr attached in that order.
"""

from __future__ import annotations

import array
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sriov_cni import __version__, wire
from sriov_cni.cni import MAX_CONFIG, Code
from sriov_cni.daemon import client, install, measure
from tests.support.daemonlib import REPO, SHIM, Daemon, shim, wait_for

ERROR = {"cniVersion": "1.0.0", "code": 7, "msg": "refused by the stand-in"}


def _shim_defines() -> dict[str, str]:
    source = (REPO / "shim" / "sriov-shim.c").read_text()
    return dict(re.findall(r"^#define (\w+) (.+)$", source, re.MULTILINE))


def test_the_shim_has_the_wire_modules_constants() -> None:
    defines = _shim_defines()
    # Each constant it has by hand is checked here: a new one must be too.
    assert set(defines) == {
        "DEFAULT_SOCKET",
        "MAX_REQUEST",
        "TAG_EXITED",
        "TAG_REFUSED",
        "CONNECT_TIMEOUT",
        "CODE_INVALID_ENV",
        "CODE_TRY_AGAIN",
    }
    assert defines["MAX_REQUEST"] == f"(1u << {wire.MAX_REQUEST.bit_length() - 1})"
    assert 1 << (wire.MAX_REQUEST.bit_length() - 1) == wire.MAX_REQUEST
    assert defines["TAG_EXITED"] == f"'{chr(wire.EXITED)}'"
    assert defines["TAG_REFUSED"] == f"'{chr(wire.REFUSED)}'"
    assert defines["CONNECT_TIMEOUT"] == str(wire.CONNECT_TIMEOUT)
    assert defines["DEFAULT_SOCKET"] == json.dumps(client.DEFAULT_SOCKET)
    # The only CNI the shim knows: its own errors.
    assert defines["CODE_INVALID_ENV"] == str(Code.INVALID_ENV.value)
    assert defines["CODE_TRY_AGAIN"] == str(Code.TRY_AGAIN.value)
    # The length field the shim sends is a uint32_t in network order.
    assert (wire.HEADER, wire.HEADER_SIZE, wire.DESCRIPTORS) == ("!I", 4, 3)


def test_a_request_without_environment_decodes_and_a_shorter_one_does_not() -> None:
    frame = wire.encode_request("1.2", "sriov", "/", {})
    assert wire.request_size(frame[: wire.HEADER_SIZE]) == len(frame) - wire.HEADER_SIZE
    assert wire.decode_request(frame[wire.HEADER_SIZE :]) == ("1.2", "sriov", "/", {})
    with pytest.raises(ValueError, match="without version, program and working directory"):
        wire.decode_request(b"1.2\0sriov")


def test_odd_environment_entries_decode_as_the_c_library_reads_them() -> None:
    body = b"1.2\0sriov\0/\0=x\0NOEQUALS\0A=b=c\0"
    assert wire.decode_request(body)[3] == {"": "x", "A": "b=c"}


@pytest.mark.parametrize(
    "body", [b"1.2\0sriov\0/", b"1.2\0sriov\0/\0A=b\0C=d", "1.2\0sr\u00efov\0/d\u00efr\0A=\u00ef".encode() + b"\xff"]
)
def test_the_head_decodes_as_the_whole_request_begins(body: bytes) -> None:
    assert wire.decode_head(body) == wire.decode_request(body)[:3]


@pytest.mark.parametrize(
    "body",
    [
        b"1.2\0sriov\0/",
        b"1.2\0sriov\0/\0CNI_COMMAND=ADD",
        b"1.2\0sriov\0/\0CNI_COMMAND=ADD\0X=1\0CNI_COMMAND=DEL\0Y=2",
        # In the head, not the environment: a working directory of that name.
        b"1.2\0sriov\0CNI_COMMAND=DEL\0CNI_COMMAND=ADD",
        b"1.2\0sriov\0CNI_COMMAND=DEL",
        b"1.2\0sriov\0/\0XCNI_COMMAND=DEL\0CNI_COMMAND=",
        b"1.2\0sriov",
    ],
)
def test_one_variable_is_found_as_the_decoded_environment_has_it(body: bytes) -> None:
    try:
        env = wire.decode_request(body)[3]
    except ValueError:
        env = {}
    assert wire.env_value(body, "CNI_COMMAND") == env.get("CNI_COMMAND")


def test_a_body_without_its_three_first_fields_has_no_head() -> None:
    with pytest.raises(ValueError, match="without version, program and working directory"):
        wire.decode_head(b"1.2\0sriov")


CONF = b'{"cniVersion": "1.0.0"}'
# A process that may open the root-only socket (it keeps CAP_DAC_OVERRIDE)
# without being root.
AS_NOBODY = [
    "setpriv",
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
    "--inh-caps",
    "+dac_override",
    "--ambient-caps",
    "+dac_override",
]
# One variable is limited to 128 KiB by execve; ten of them exceed wire.MAX_REQUEST.
BIG_ENV = {f"BIG{i}": "x" * (120 << 10) for i in range(10)}


@dataclass(frozen=True)
class Answer:
    """An executable's exit status, and its stdout after what the peer wrote there itself."""

    # None: the plugin's own status and output, as it answers run directly.
    status: int | None
    # The code of the CNI error object printed; its msg holds ``msg`` (with
    # "{socket}" for the socket's path).  None: nothing printed.
    code: int | None = None
    msg: str = ""


PLUGIN = Answer(None)
NO_ANSWER = Answer(
    1,
    11,
    "the sriov-cni daemon at {socket} ended without an answer (did it die or restart?); "
    "the call may have partly run and was not retried",
)


class Peer:
    """What listens on the socket, or does not, while the two executables call."""

    # What the peer writes to the caller's stdout and stderr itself.
    out = b""
    err = b""

    def during(self, proc: subprocess.Popen[bytes]) -> None:
        """While ``proc`` waits for its answer, with its stdin still open."""

    def close(self) -> None:
        pass


class StandIn(Peer):
    """A daemon that answers each of the two calls with the bytes it is given."""

    out = b"OUT\n"
    err = b"ERR\n"

    def __init__(self, path: Path, answer: bytes) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(2)
        self.listener.settimeout(60)
        self.answer = answer
        # Where the test runs the executables.
        self.cwd = str(path.parent.parent / "cwd")
        self.runs = answer[:1] in (b"", bytes([wire.EXITED]))
        self.requests: list[tuple[str, str, str, dict[str, str]]] = []
        self.stdins: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for _ in range(2):
            conn, _ = self.listener.accept()
            with conn:
                fds = array.array("i")
                header, ancdata, _, _ = conn.recvmsg(wire.HEADER_SIZE, socket.CMSG_SPACE(3 * fds.itemsize))
                for _, _, data in ancdata:
                    fds.frombytes(data)
                body = b""
                while len(body) < wire.request_size(header):
                    body += conn.recv(65536)
                self.requests.append(wire.decode_request(body))
                assert len(fds) == wire.DESCRIPTORS
                # As a daemon does: a call it ran (or began to) read its
                # stdin; one it refused left it to the executable.
                with open(fds[0], "rb") as stdin:
                    if self.runs:
                        self.stdins.append(stdin.read())
                os.write(fds[1], self.out)
                os.write(fds[2], self.err)
                os.close(fds[1])
                os.close(fds[2])
                conn.sendall(self.answer)

    def close(self) -> None:
        self.thread.join(timeout=60)
        self.listener.close()
        assert len(self.requests) == 2, "the stand-in did not take both requests"
        for version, program, cwd, env in self.requests:
            assert (version, program) == (__version__, "sriov")
            assert cwd == self.cwd and env["CONFORMANCE"] == "yes"
        assert self.stdins == ([CONF, CONF] if self.runs else [])


def stand_in(answer: bytes) -> Callable[[Path], Peer]:
    return lambda path: StandIn(path, answer)


class RealDaemon(Peer):
    """``sriov-cni daemon``, each child reporting the calls it ran to their end."""

    def __init__(self, path: Path) -> None:
        self.stats = path.parent.parent / "stats"
        self.stats.mkdir()
        self.daemon = Daemon(path.parent, env={measure.STATS_ENV: str(self.stats)})

    def ran(self, expected: int) -> int:
        """Calls run to their end, once ``expected`` of them reported (a child reports after answering)."""
        if expected:
            wait_for(lambda: len(list(self.stats.glob("*.json"))) >= expected)
        return len(list(self.stats.glob("*.json")))

    def close(self) -> None:
        self.daemon.stop()


class KillingDaemon(RealDaemon):
    """A daemon whose child is killed in the middle of each call."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.killed: set[int] = set()

    def during(self, proc: subprocess.Popen[bytes]) -> None:
        # The child waits for the end of the caller's stdin.  One killed
        # before stays among the children until the daemon reaps it.
        [child] = wait_for(lambda: [pid for pid in self.daemon.children() if pid not in self.killed])
        os.kill(child, signal.SIGKILL)
        self.killed.add(child)

    def close(self) -> None:
        # The daemon itself is unharmed.
        rc, out = shim(self.daemon.socket, "VERSION", CONF)
        assert rc == 0 and "1.0.0" in out["supportedVersions"], out
        super().close()


class Absent(Peer):
    """No daemon, and no socket file."""

    def __init__(self, path: Path) -> None:
        assert not path.exists()


class Refusing(Peer):
    """A socket file nobody listens on: a daemon that died."""

    def __init__(self, path: Path) -> None:
        self.bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.bound.bind(str(path))

    def close(self) -> None:
        self.bound.close()


class Stopped(Peer):
    """A stopped daemon: its listen queue is full and stays full."""

    def __init__(self, path: Path) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(0)
        self.queued = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.queued.connect(str(path))

    def close(self) -> None:
        self.queued.close()
        self.listener.close()


@dataclass(frozen=True)
class Case:
    name: str
    peer: Callable[[Path], Peer]
    shim: Answer
    # None: the Python executable answers as the shim does, byte for byte.
    python: Answer | None = None
    stdin: bytes = CONF
    env: dict[str, str] = field(default_factory=dict)
    as_nobody: bool = False
    # How many of the two calls a real daemon ran to their end.
    ran: int | None = None


CASES = [
    Case("served", RealDaemon, PLUGIN, ran=2),
    # The plugin's own refusal, run by the daemon.
    Case("oversized-config", RealDaemon, PLUGIN, stdin=b" " * (MAX_CONFIG + 1), ran=2),
    # The daemon refuses; the Python executable runs the call itself.
    Case(
        "not-root",
        RealDaemon,
        Answer(1, 4, "only root may call the sriov-cni daemon, not uid 65534; nothing ran"),
        PLUGIN,
        as_nobody=True,
        ran=0,
    ),
    # The shim refuses it itself; the daemon refuses the Python executable's.
    Case(
        "oversized-request",
        RealDaemon,
        Answer(1, 4, f"more than the {wire.MAX_REQUEST} the sriov-cni daemon accepts"),
        PLUGIN,
        env=BIG_ENV,
        ran=0,
    ),
    Case("killed-mid-call", KillingDaemon, NO_ANSWER, ran=0),
    Case(
        "no-daemon",
        Absent,
        Answer(
            1,
            11,
            "the sriov-cni daemon is not reachable at {socket} (No such file or "
            "directory): start it with `sriov-cni daemon`",
        ),
        PLUGIN,
    ),
    Case("connection-refused", Refusing, Answer(1, 11, "not reachable at {socket} (Connection refused)"), PLUGIN),
    Case(
        "daemon-stopped",
        Stopped,
        Answer(1, 11, f"not reachable at {{socket}} (it did not accept within {wire.CONNECT_TIMEOUT} s)"),
        PLUGIN,
    ),
    Case("exited-0", stand_in(wire.exited(0)), Answer(0)),
    Case("exited-3", stand_in(wire.exited(3)), Answer(3)),
    # The status a plain status byte could not tell from "refused".
    Case("exited-255", stand_in(wire.exited(255)), Answer(255)),
    Case(
        "refused",
        stand_in(wire.refused(json.dumps(ERROR).encode() + b"\n")),
        Answer(1, 7, "refused by the stand-in"),
        PLUGIN,
    ),
    Case("no-answer", stand_in(b""), NO_ANSWER),
    Case("cut-after-tag", stand_in(bytes([wire.EXITED])), NO_ANSWER),
    # What a daemon from before the tag answers an executable of another version.
    Case(
        "unknown-tag",
        stand_in(b"\xff" + json.dumps(ERROR).encode()),
        Answer(1, 11, "answered in a form this shim (version " + __version__ + ") does not know (first byte 0xff)"),
        PLUGIN,
    ),
]


def _call(argv: list[str], sock: Path, case: Case, peer: Peer, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {
        "CNI_COMMAND": "VERSION",
        "SRIOV_CNI_SOCKET": str(sock),
        "CONFORMANCE": "yes",
        "PATH": "/usr/bin:/bin",
        **case.env,
    }
    if case.as_nobody:
        argv = AS_NOBODY + argv
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # no caches owned by nobody in the tree
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    try:
        peer.during(proc)
        out, err = proc.communicate(case.stdin, timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _plugin(case: Case) -> tuple[int, bytes]:
    """The plugin's answer, run directly."""
    env = {"CNI_COMMAND": "VERSION", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **case.env}
    proc = subprocess.run(
        [sys.executable, "-c", "from sriov_cni.plugin.commands import main; main()"],
        input=case.stdin,
        env=env,
        capture_output=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout


def _check(
    answer: Answer, proc: subprocess.CompletedProcess[bytes], peer: Peer, plugin: tuple[int, bytes], sock: Path
) -> None:
    assert proc.stdout.startswith(peer.out) and proc.stderr.startswith(peer.err), proc
    rest = proc.stdout[len(peer.out) :]
    if answer.status is None:
        assert (proc.returncode, rest) == plugin, proc
    elif answer.code is None:
        assert (proc.returncode, rest) == (answer.status, b""), proc
    else:
        error = json.loads(rest)
        assert proc.returncode == answer.status, proc
        assert error["code"] == answer.code and answer.msg.format(socket=sock) in error["msg"], error


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_shim_and_the_python_executable_answer_alike(case: Case, tmp_path: Path) -> None:
    sock = tmp_path / "run" / "plugin.sock"
    sock.parent.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    shim_exe = tmp_path / "shim" / "sriov"
    shim_exe.parent.mkdir()
    shim_exe.symlink_to(SHIM)
    [python_exe] = [p for p in install.install(str(tmp_path / "python"), sys.executable) if p.endswith("/sriov")]
    plugin = _plugin(case)
    assert plugin[0] in (0, 1) and json.loads(plugin[1]), plugin
    peer = case.peer(sock)
    try:
        from_shim = _call([str(shim_exe)], sock, case, peer, cwd)
        from_python = _call([python_exe], sock, case, peer, cwd)
        if case.ran is not None:
            assert isinstance(peer, RealDaemon)
            assert peer.ran(case.ran) == case.ran
    finally:
        peer.close()
    _check(case.shim, from_shim, peer, plugin, sock)
    if case.python is None:
        assert (from_python.returncode, from_python.stdout) == (from_shim.returncode, from_shim.stdout), from_python
    else:
        _check(case.python, from_python, peer, plugin, sock)
