"""``pip install`` from a clean clone gives a complete install: the shim is built into it.

Real: a ``git clone`` of this repository's HEAD, a fresh virtual environment,
pip with build isolation (setuptools and the dependencies from the index, as
a user's pip gets them), the package's build step running the compiler, the
venv's ``sriov-cni install-cni`` and daemon, and calls through the shim it
wrote.  The venv runs the code it installed: PYTHONPATH, which points the
rest of the suite at the checkout, is emptied for everything started here.
The builds that must fail run against a compiler that is missing, and one
that has no libc to link (a wrapper of gcc with an empty sysroot).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.daemonlib import REPO, Daemon, ipam_conf, ipam_env, shim

# Python treats an empty PYTHONPATH as unset.
CLEAN_ENV = dict(os.environ, PYTHONPATH="")


@dataclass(frozen=True)
class Installed:
    src: Path  # the clean clone
    venv: Path


def run(*argv: str | Path, env: dict[str, str] = CLEAN_ENV) -> subprocess.CompletedProcess[str]:
    # The bound only keeps a hung pip from hanging the suite: a build under
    # load, with the build environment fetched, takes minutes, not ten.
    # Run from / so that ``python -c`` does not import the checkout it was started in.
    return subprocess.run([str(a) for a in argv], env=env, cwd="/", capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("pip")
    src, venv = tmp / "src", tmp / "venv"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(src)], check=True)
    assert not (src / "sriov_cni" / "daemon" / "sriov-shim").exists(), "a clone carries no built shim"
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, env=CLEAN_ENV)
    done = run(venv / "bin" / "pip", "install", "--quiet", src)
    assert done.returncode == 0, done.stdout + done.stderr
    yield Installed(src, venv)


def test_install_cni_writes_the_shim_that_serves_calls_through_the_venvs_daemon(
    installed: Installed, tmp_path: Path
) -> None:
    venv = installed.venv
    where = run(venv / "bin" / "python", "-c", "import sriov_cni.daemon.install as i; print(i.SHIM)")
    shipped = Path(where.stdout.strip())
    assert shipped.is_relative_to(venv), f"the venv runs its own install, not {shipped}"
    dest = tmp_path / "cni-bin"
    done = run(venv / "bin" / "sriov-cni", "install-cni", "--dest", dest, "--create-dest")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["sriov", "sriov-ipam"]
    assert (dest / "sriov").read_bytes() == shipped.read_bytes()

    def venv_daemon(socket: str, *options: str) -> list[str]:
        return [str(venv / "bin" / "sriov-cni"), "daemon", "--socket", socket, *options]

    with Daemon(tmp_path / "run", program=venv_daemon, env={"PYTHONPATH": ""}, cwd=tmp_path) as daemon:
        rc, out = shim(daemon.socket, "VERSION", b'{"cniVersion": "1.0.0"}', exe=dest / "sriov")
        assert rc == 0 and "1.0.0" in out["supportedVersions"], out
        # A call that runs a plugin in the daemon's child: sriov-ipam's
        # lease, taken and given back through the written shim.
        conf = ipam_conf(tmp_path)
        rc, out = shim(daemon.socket, "ADD", conf, exe=dest / "sriov-ipam", name="sriov-ipam", env=ipam_env("c1"))
        assert rc == 0, out
        address = out["ips"][0]["address"].split("/")[0]
        assert [p.name for p in (tmp_path / "ipam").rglob("10.77.0.*")] == [address]
        rc, out = shim(daemon.socket, "DEL", conf, exe=dest / "sriov-ipam", name="sriov-ipam", env=ipam_env("c1"))
        assert (rc, out) == (0, {})
        assert not list((tmp_path / "ipam").rglob("10.77.0.*"))


@pytest.mark.parametrize("toolchain", ["missing compiler", "no static libc"])
def test_a_build_without_the_toolchain_fails_with_one_line_naming_it(
    installed: Installed, tmp_path: Path, toolchain: str
) -> None:
    if toolchain == "missing compiler":
        cc = str(tmp_path / "no-such-cc")
        said = f"the compiler {cc!r} (CC) is not installed"
    else:
        # gcc as on a machine without libc6-dev: nothing to link against.
        cc = str(tmp_path / "gcc-without-libc")
        Path(cc).write_text('#!/bin/sh\nexec gcc --sysroot=/nonexistent "$@"\n')
        Path(cc).chmod(0o755)
        said = f"{cc} cannot build a static program"
    src = tmp_path / "src"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(installed.src), str(src)], check=True)
    done = run(
        installed.venv / "bin" / "pip",
        "wheel",
        "--no-deps",
        "--wheel-dir",
        tmp_path / "dist",
        src,
        env=dict(CLEAN_ENV, CC=cc),
    )
    assert done.returncode != 0
    [line] = [line.strip() for line in done.stderr.splitlines() if "building the sriov-cni shim" in line]
    assert line.startswith(
        "error: building the sriov-cni shim needs a C compiler and a static libc "
        f"(Debian/Ubuntu: apt-get install gcc libc6-dev make): {said}"
    ), line
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))
