"""The ``bin/sriov`` executable as a runtime runs it: protocol on stdout, logs on stderr, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sriov_cni.cni import MAX_CONFIG
from tests.support.pluginlib import SRIOV_BIN, Outcome, run_bin

SUPPORTED = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


def env(command: str | None, **extra: str) -> dict[str, str]:
    out = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_PATH": "/usr/lib/cni"}
    if command is not None:
        out["CNI_COMMAND"] = command
    out.update(extra)
    return out


def no_traceback(res: Outcome) -> None:
    assert "Traceback" not in res.stdout and "Traceback" not in res.stderr, res.stderr


def test_is_executable() -> None:
    assert os.access(SRIOV_BIN, os.X_OK)


@pytest.mark.parametrize("stdin,answer", [(b'{"cniVersion": "0.4.0"}', "0.4.0"), (b"", "1.1.0")])
def test_version(stdin: bytes, answer: str) -> None:
    res = run_bin(env("VERSION"), stdin)
    assert res.rc == 0
    assert json.loads(res.stdout) == {"cniVersion": answer, "supportedVersions": SUPPORTED}
    no_traceback(res)


def test_no_command_prints_about_line_to_stderr() -> None:
    res = run_bin(env(None), b"")
    assert res.rc == 0
    assert res.stdout == ""
    assert res.stderr.startswith("sriov CNI plugin ")
    assert "1.1.0" in res.stderr


@pytest.mark.parametrize(
    "stdin,code",
    [(b"{not json", 6), (b"\xff\xfe", 6), (b'"a string"', 6), (b'{"cniVersion": "0.9.0", "name": "n"}', 1)],
)
def test_bad_stdin_is_an_error_object(stdin: bytes, code: int) -> None:
    res = run_bin(env("ADD", CNI_CONTAINERID="c", CNI_NETNS="/var/run/netns/x", CNI_IFNAME="net1"), stdin)
    assert res.rc != 0
    out = json.loads(res.stdout)
    assert out["code"] == code and out["msg"]
    assert out["cniVersion"] == "1.1.0"
    no_traceback(res)


def test_unknown_command_is_code_4() -> None:
    res = run_bin(env("FROB"), b'{"cniVersion": "1.0.0", "name": "n"}')
    assert res.rc != 0 and json.loads(res.stdout)["code"] == 4
    no_traceback(res)


def test_add_with_unknown_pf_fails_in_the_config_version(tmp_path: Path) -> None:
    conf = {"cniVersion": "0.4.0", "name": "n", "type": "sriov", "pfNames": ["nosuchpf7"], "dataDir": str(tmp_path)}
    res = run_bin(
        env("ADD", CNI_CONTAINERID="c", CNI_NETNS="/proc/self/ns/net", CNI_IFNAME="net1"), json.dumps(conf).encode()
    )
    assert res.rc != 0
    out = json.loads(res.stdout)
    assert out == {"cniVersion": "0.4.0", "code": 7, "msg": out["msg"]} and "nosuchpf7" in out["msg"]
    assert "ERROR" in res.stderr  # logged on stderr, not stdout
    no_traceback(res)


def test_del_of_nothing_succeeds_silently(tmp_path: Path) -> None:
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "sriov", "pfNames": ["x"], "dataDir": str(tmp_path)}
    res = run_bin(env("DEL", CNI_CONTAINERID="c", CNI_NETNS="", CNI_IFNAME="net1"), json.dumps(conf).encode())
    assert res.rc == 0, res.stdout
    assert res.stdout == ""
    no_traceback(res)


@pytest.mark.parametrize("command", ["VERSION", "ADD"])
def test_a_stdin_that_never_ends_is_an_error_not_a_growing_plugin(command: str, tmp_path: Path) -> None:
    # Read without a bound, /dev/zero grows the plugin until it is killed;
    # the timeout here only keeps that from hanging the suite.
    call_env = env(
        command,
        CNI_CONTAINERID="c",
        CNI_NETNS="/proc/1/ns/net",
        CNI_IFNAME="net1",
        SRIOV_CNI_SOCKET=str(tmp_path / "no-daemon.sock"),
    )
    with open("/dev/zero", "rb") as zero:
        proc = subprocess.run([str(SRIOV_BIN)], stdin=zero, env=call_env, capture_output=True, timeout=60)
    out = json.loads(proc.stdout)
    assert proc.returncode == 1 and out["code"] == 7, out
    assert f"larger than {MAX_CONFIG} bytes" in out["msg"]


def test_a_config_just_within_the_bound_is_read_whole() -> None:
    padding = " " * (MAX_CONFIG - len('{"cniVersion": "0.4.0"}'))
    res = run_bin(env("VERSION"), ('{"cniVersion": "0.4.0"}' + padding).encode())
    assert res.rc == 0 and json.loads(res.stdout)["cniVersion"] == "0.4.0", res
    res = run_bin(env("VERSION"), ('{"cniVersion": "0.4.0"}' + padding + " ").encode())
    assert res.rc == 1 and json.loads(res.stdout)["code"] == 7, res
