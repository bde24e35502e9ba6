"""Fixtures for the IPAM tests: ways to invoke a CNI IPAM and config builders.

``cni`` runs ipam's handlers in-process through ``dispatch``; ``exe`` runs the
real ``bin/sriov-ipam``; ``host_local`` runs Debian's host-local binary.  All
three take the same arguments and return an :class:`Outcome`.  The tests
annotate these fixtures with the types in tests/ipam/ipamtypes.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.cni import dispatch
from sriov_cni.ipam.main import HANDLERS
from tests.ipam.ipamtypes import Invoke, MakeConf, Outcome, Spawn, Stored, Wait

REPO = Path(__file__).resolve().parents[2]
EXE = REPO / "bin" / "sriov-ipam"
HOST_LOCAL = Path("/usr/lib/cni/host-local")


def cni_env(command: str, cid: str, ifname: str, cni_args: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/var/run/netns/test",
        "CNI_IFNAME": ifname,
        "CNI_ARGS": cni_args,
        # host-local reads nothing from it, but skel requires it for ADD.
        "CNI_PATH": "/usr/lib/cni",
    }


def _parse(stdout: str) -> dict[str, Any] | None:
    return json.loads(stdout) if stdout.strip() else None


def invoke_in_process(
    command: str, conf: dict[str, Any], cid: str = "c1", ifname: str = "eth0", cni_args: str = ""
) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    rc = dispatch(HANDLERS, cni_env(command, cid, ifname, cni_args), json.dumps(conf).encode(), out, err, "test")
    return Outcome(rc, _parse(out.getvalue()), err.getvalue())


def run_binary(
    binary: Path, command: str, conf: dict[str, Any], cid: str, ifname: str, cni_args: str, type_: str
) -> Outcome:
    # host-local insists on its own type name; give each tool the same
    # config otherwise.
    conf = {**conf, "ipam": {**conf["ipam"], "type": type_}}
    env = {**os.environ, **cni_env(command, cid, ifname, cni_args)}
    proc = subprocess.run([str(binary)], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=120)
    return Outcome(proc.returncode, _parse(proc.stdout.decode()), proc.stderr.decode())


@pytest.fixture
def cni() -> Invoke:
    return invoke_in_process


@pytest.fixture
def exe() -> Invoke:
    def run(command: str, conf: dict[str, Any], cid: str = "c1", ifname: str = "eth0", cni_args: str = "") -> Outcome:
        return run_binary(EXE, command, conf, cid, ifname, cni_args, "sriov-ipam")

    return run


@pytest.fixture
def host_local() -> Invoke:
    def run(command: str, conf: dict[str, Any], cid: str = "c1", ifname: str = "eth0", cni_args: str = "") -> Outcome:
        return run_binary(HOST_LOCAL, command, conf, cid, ifname, cni_args, "host-local")

    return run


@pytest.fixture
def exe_path() -> Path:
    return EXE


@pytest.fixture
def spawn() -> Spawn:
    """Start bin/sriov-ipam without waiting, for parallel runs."""

    def start(command: str, conf: dict[str, Any], cid: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(EXE)],
            env={**os.environ, **cni_env(command, cid, "eth0", "")},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        return proc

    return start


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, dict[str, Any] | None]:
    # stdin is already closed, which communicate() would try to flush.
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stdout, proc.stderr:
        out = proc.stdout.read()
        proc.stderr.read()
    return proc.wait(timeout=300), _parse(out.decode())


@pytest.fixture
def wait() -> Wait:
    """Wait for a spawned process: (exit status, parsed stdout)."""
    return finish


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "networks"


@pytest.fixture
def netconf(data_dir: Path) -> MakeConf:
    """Build a network config: ``netconf(ranges, version=..., **extra_ipam_keys)``."""

    def make(ranges: list[list[dict[str, str]]] | None = None, version: str = "1.0.0", **ipam: Any) -> dict[str, Any]:
        section: dict[str, Any] = {"type": "sriov-ipam", "dataDir": str(data_dir), **ipam}
        if ranges is not None:
            section["ranges"] = ranges
        return {"cniVersion": version, "name": "testnet", "type": "sriov", "ipam": section}

    return make


@pytest.fixture
def net_dir(data_dir: Path) -> Path:
    """The store directory of the network ``netconf`` builds."""
    return data_dir / "testnet"


@pytest.fixture
def stored(net_dir: Path) -> Stored:
    """Reads the store as an outsider: address file name -> raw content."""

    def read() -> dict[str, str]:
        skip = ("lock", "last_reserved_ip.", "attachment:")
        if not net_dir.exists():
            return {}
        return {p.name: p.read_bytes().decode() for p in net_dir.iterdir() if not p.name.startswith(skip)}

    return read
