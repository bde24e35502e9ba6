"""Both executables speak the frame of sriov_cni.daemon.wire, case for case.

The shim's compiled-in constants are read from its source and compared
with the module's.  Then one table of daemon answers is played, by a stand-in
daemon on a temporary socket, to the real static shim and to the Python
executable; each row says what each must make of it.  The stand-in also
checks the request each sent: decoded by the module, with the caller's
stdin, stdout and stderr attached in that order.
"""

from __future__ import annotations

import array
import json
import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from daemonlib import REPO, SHIM
from sriov_cni import __version__
from sriov_cni.daemon import client, wire

ERROR = {"cniVersion": "1.0.0", "code": 7, "msg": "refused by the stand-in"}


def _shim_defines() -> dict[str, str]:
    source = (REPO / "shim" / "sriov-shim.c").read_text()
    return dict(re.findall(r"^#define (\w+) (.+)$", source, re.MULTILINE))


def test_the_shim_has_the_wire_modules_constants() -> None:
    defines = _shim_defines()
    assert defines["MAX_REQUEST"] == f"(1u << {wire.MAX_REQUEST.bit_length() - 1})"
    assert 1 << (wire.MAX_REQUEST.bit_length() - 1) == wire.MAX_REQUEST
    assert defines["TAG_EXITED"] == f"'{chr(wire.EXITED)}'"
    assert defines["TAG_REFUSED"] == f"'{chr(wire.REFUSED)}'"
    assert defines["CONNECT_TIMEOUT"] == str(wire.CONNECT_TIMEOUT)
    assert defines["DEFAULT_SOCKET"] == json.dumps(client.DEFAULT_SOCKET)
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


@dataclass(frozen=True)
class Case:
    name: str
    answer: bytes
    # The shim's exit status, and the CNI error code it prints (None: the
    # stand-in's stdout only).
    shim_status: int
    shim_code: int | None
    # What client.via_daemon returns: a status, or None for "run it here".
    client_result: int | None
    msg: str = ""


CASES = [
    Case("exited-0", wire.exited(0), 0, None, 0),
    Case("exited-3", wire.exited(3), 3, None, 3),
    # The status a plain status byte could not tell from "refused".
    Case("exited-255", wire.exited(255), 255, None, 255),
    Case("refused", wire.refused(json.dumps(ERROR).encode() + b"\n"), 1, 7, None, "refused by the stand-in"),
    Case("no-answer", b"", 1, 11, 1, "may have partly run"),
    Case("cut-after-tag", bytes([wire.EXITED]), 1, 11, 1, "may have partly run"),
    # What a daemon from before the tag answers a shim of another version.
    Case("old-refused", b"\xff" + json.dumps(ERROR).encode(), 1, 11, None, "another version"),
]


class StandIn:
    """A daemon that answers one call with the bytes it is given."""

    def __init__(self, path: Path, answer: bytes) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.answer = answer
        self.request: tuple[str, str, str, dict[str, str]] | None = None
        self.stdin = b""
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            fds = array.array("i")
            header, ancdata, _, _ = conn.recvmsg(wire.HEADER_SIZE, socket.CMSG_SPACE(3 * fds.itemsize))
            for _, _, data in ancdata:
                fds.frombytes(data)
            body = b""
            while len(body) < wire.request_size(header):
                body += conn.recv(65536)
            self.request = wire.decode_request(body)
            assert len(fds) == wire.DESCRIPTORS
            with open(fds[0], "rb") as stdin:
                self.stdin = stdin.read()
            os.write(fds[1], b"OUT\n")
            os.write(fds[2], b"ERR\n")
            os.close(fds[1])
            os.close(fds[2])
            conn.sendall(self.answer)

    def join(self) -> None:
        self.thread.join(timeout=60)
        self.listener.close()
        assert self.request is not None, "the stand-in took no request"
        version, program, _, env = self.request
        assert version == __version__
        assert env["CONFORMANCE"] == "yes"
        assert self.stdin == b'{"cniVersion": "1.0.0"}'


def _run(argv: list[str], sock: Path, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"CNI_COMMAND": "VERSION", "SRIOV_CNI_SOCKET": str(sock), "CONFORMANCE": "yes", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(REPO)}
    return subprocess.run(argv, input=b'{"cniVersion": "1.0.0"}', env=env, cwd=cwd, capture_output=True,
                          timeout=60)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_shim_reads_each_answer_as_the_table_says(case: Case, tmp_path: Path) -> None:
    link = tmp_path / "sriov"
    link.symlink_to(SHIM)
    stand_in = StandIn(tmp_path / "s.sock", case.answer)
    proc = _run([str(link)], tmp_path / "s.sock", tmp_path)
    stand_in.join()
    assert stand_in.request is not None and stand_in.request[1:3] == ("sriov", str(tmp_path))
    assert proc.returncode == case.shim_status, proc
    assert proc.stderr == b"ERR\n"
    out = proc.stdout.decode()
    assert out.startswith("OUT\n"), out
    if case.shim_code is None:
        assert out == "OUT\n"
    else:
        error = json.loads(out[len("OUT\n"):])
        assert error["code"] == case.shim_code and case.msg in error["msg"], error


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_python_client_reads_each_answer_as_the_table_says(case: Case, tmp_path: Path) -> None:
    probe = ("import sys\nfrom sriov_cni.daemon import client\n"
             "sys.stderr.write(f'RESULT {client.via_daemon(sys.argv[1])!r}')\n")
    stand_in = StandIn(tmp_path / "s.sock", case.answer)
    proc = _run([sys.executable, "-S", "-c", probe, str(tmp_path / "s.sock")], tmp_path / "s.sock", tmp_path)
    stand_in.join()
    assert stand_in.request is not None and stand_in.request[1:3] == ("sriov", str(tmp_path))
    assert proc.returncode == 0, proc
    assert proc.stderr.decode().endswith(f"RESULT {case.client_result!r}"), proc.stderr
    out = proc.stdout.decode()
    assert out.startswith("OUT\n"), out
    if case.client_result is None or case.shim_code is None:
        # Refused: the call runs in process next, which prints its own answer.
        assert out == "OUT\n"
    else:
        error = json.loads(out[len("OUT\n"):])
        assert error["code"] == case.shim_code and case.msg in error["msg"], error
