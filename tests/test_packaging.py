"""The sdist and the wheel as PyPI would get them: licence, metadata, platform tag, nothing half-shipped.

Both are built from the work tree's files (tracked, and new ones not
ignored) copied aside, without build isolation: the build backend of the
test extras is used, so no package index is needed.  The wheel is built
from the sdist, as ``python -m build`` does, so an sdist missing a file
its build needs fails here too.
"""

from __future__ import annotations

import ast
import email.parser
import importlib.util
import platform
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
from packaging.tags import parse_tag, sys_tags

REPO = Path(__file__).resolve().parents[1]
SHIM = "sriov_cni/daemon/sriov-shim"
# Our own top-level packages: an import of one of them must resolve inside
# the archive that ships the importing file.
FIRST_PARTY = {"sriov_cni", "tests"}


@dataclass(frozen=True)
class Built:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    if importlib.util.find_spec("build") is None:
        pytest.fail("the build frontend is not installed: run tests/setup-host.sh (it installs the test extras)")
    tmp = tmp_path_factory.mktemp("packaging")
    src, out = tmp / "src", tmp / "dist"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    assert not (src / SHIM).exists(), "the copy carries no built shim: the build makes its own"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [sdist] = out.glob("*.tar.gz")
    [wheel] = out.glob("*.whl")
    yield Built(sdist, wheel)


def _sdist_files(sdist: Path) -> dict[str, bytes]:
    """The sdist's regular files by their path inside its top directory."""
    with tarfile.open(sdist) as tar:
        out = {}
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            if f is not None:
                out[member.name.split("/", 1)[1]] = f.read()
        return out


def _orphan_imports(files: dict[str, bytes]) -> list[str]:
    """Each first-party import in a shipped .py file that resolves to no shipped module."""
    modules = {str(PurePosixPath(p).with_suffix("")).replace("/", ".") for p in files if p.endswith(".py")}
    modules |= {m.removesuffix(".__init__") for m in modules}
    orphans = []
    for path, data in files.items():
        if not path.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(data, path)):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # "from pkg import mod" may name a module or a name in pkg.
                names = [node.module]
            for name in names:
                if name.split(".")[0] in FIRST_PARTY and name not in modules:
                    orphans.append(f"{path}: {name}")
    return orphans


def test_the_sdist_ships_the_licence_and_the_shim_source_and_no_half_of_the_tests(built: Built) -> None:
    files = _sdist_files(built.sdist)
    assert files["LICENSE"] == (REPO / "LICENSE").read_bytes()
    assert b"Apache License" in files["LICENSE"] and b"Version 2.0, January 2004" in files["LICENSE"]
    assert {"shim/Makefile", "shim/sriov-shim.c", "setup.py", "pyproject.toml"} <= set(files)
    assert SHIM not in files, "the sdist carries source, not the built shim"
    assert _orphan_imports(files) == []
    assert not any(p.startswith("tests/") for p in files), "the tests run from a checkout"


def test_the_wheel_carries_the_licence_and_its_metadata(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as whl:
        names = whl.namelist()
        [dist_info] = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        licence = whl.read(f"{dist_info}/licenses/LICENSE")
        meta = email.parser.BytesParser().parsebytes(whl.read(f"{dist_info}/METADATA"))
        files = {n: whl.read(n) for n in names if n.endswith(".py")}
    assert licence == (REPO / "LICENSE").read_bytes()
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert not any(c.startswith("License ::") for c in meta.get_all("Classifier") or [])
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls["Homepage"].startswith("https://github.com/")
    assert SHIM in names
    assert not any(n.startswith("tests/") for n in names)
    assert _orphan_imports(files) == []


def test_a_static_shim_tags_the_wheel_for_every_linux_of_its_architecture(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as whl:
        shim = whl.read(SHIM)
        [wheel_file] = [n for n in whl.namelist() if n.endswith(".dist-info/WHEEL")]
        declared = {
            line.split(": ", 1)[1] for line in whl.read(wheel_file).decode().splitlines() if line[:5] == "Tag: "
        }
    extracted = built.wheel.parent / "shim"
    extracted.write_bytes(shim)
    # file(1) is the oracle for "static", not setup.py's own ELF reading.
    described = subprocess.run(["file", "-b", str(extracted)], capture_output=True, text=True, check=True).stdout
    assert "statically linked" in described, described
    tag = built.wheel.name.removesuffix(".whl").split("-", 2)[2]
    arch = platform.machine()
    assert tag == f"py3-none-manylinux_2_17_{arch}.manylinux2014_{arch}.musllinux_1_1_{arch}"
    assert declared == {str(t) for t in parse_tag(tag)}
    # pip on this machine installs it: one of its tags is this system's.
    assert parse_tag(tag) & set(sys_tags())
