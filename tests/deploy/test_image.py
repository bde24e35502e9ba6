"""The image of the DaemonSet (deploy/kubernetes/base), built by deploy/image/build-image.sh and run
with podman: the commands the DaemonSet runs exist, and its install step
writes the static shim to the node directory it is given.

The build is offline (base bootstrapped from the Debian mirror, the pinned
wheels from the host's pip) and cached by podman's layers, so a rerun costs
seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sriov_cni import __version__
from tests.deploy.requirements import REQUIREMENTS, canonical, canonical_pin, pinned

REPO = Path(__file__).resolve().parents[2]
IMAGE = f"localhost/sriov-cni:{__version__}"
# The same modest rlimits build-image.sh gives a build: a host that is itself
# a container may not raise them to podman's defaults.
PODMAN_RUN = [
    "podman",
    "run",
    "--rm",
    "--network",
    "host",
    "--ulimit",
    "nofile=4096:4096",
    "--ulimit",
    "nproc=4096:4096",
]


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    subprocess.run(
        ["bash", str(REPO / "deploy" / "image" / "build-image.sh"), "--offline"], check=True, stdout=subprocess.DEVNULL
    )
    yield IMAGE


def run_in(image: str, *argv: str, volumes: tuple[str, ...] = ()) -> str:
    opts = [a for v in volumes for a in ("--volume", v)]
    out = subprocess.run([*PODMAN_RUN, *opts, image, *argv], check=True, capture_output=True, text=True)
    return out.stdout


def test_cli_lists_the_daemonset_commands(image: str) -> None:
    out = run_in(image, "sriov-cni", "--help")
    for command in ("install-cni", "setup", "daemon"):
        assert f"\n  {command} " in out, out


def test_install_step_writes_the_static_shim(image: str, tmp_path: Path) -> None:
    run_in(image, "sriov-cni", "install-cni", "--dest", "/host/opt/cni/bin", volumes=(f"{tmp_path}:/host/opt/cni/bin",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sriov", "sriov-ipam"]
    sriov = (tmp_path / "sriov").read_bytes()
    assert (tmp_path / "sriov-ipam").read_bytes() == sriov
    # Static: an ELF with no program interpreter (PT_INTERP) runs on any
    # node's libc.
    assert sriov[:4] == b"\x7fELF"
    assert b"/lib64/ld-linux" not in sriov
    for name in ("sriov", "sriov-ipam"):
        assert os.access(tmp_path / name, os.X_OK)
    # Run on the host, outside the image: with no daemon behind the socket it
    # answers as the CNI spec asks of a plugin that cannot serve yet.
    env = {"CNI_COMMAND": "VERSION", "SRIOV_CNI_SOCKET": str(tmp_path / "no-daemon.sock")}
    res = subprocess.run([str(tmp_path / "sriov")], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert res.returncode == 1
    assert json.loads(res.stdout)["code"] == 11


def test_the_image_runs_the_pinned_releases(image: str) -> None:
    # pip freeze in the image: the pinned requirements, sriov-cni's own wheel,
    # and the pip and setuptools the venv brings with bookworm's python3-venv.
    frozen = run_in(image, "/opt/sriov-cni/venv/bin/pip", "freeze", "--all").splitlines()
    pins = {canonical(name): version for name, version in pinned(REQUIREMENTS)}
    found = dict(canonical_pin(line) for line in frozen if "==" in line)
    assert {k: v for k, v in found.items() if k not in ("pip", "setuptools")} == pins
    assert [line for line in frozen if "==" not in line] == [line for line in frozen if line.startswith("sriov-cni @")]
