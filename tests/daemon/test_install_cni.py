"""``sriov-cni install-cni`` on a node as a new user finds it (issue #46, item 8).

A destination that does not exist is refused, naming what is missing, and
nothing is created unless --create-dest says so.  An executable in the way
that sriov-cni did not write (the reference Go plugin's ``sriov``) is
replaced with one line saying so and kept as ``sriov.orig``; our own
earlier executables are replaced without a word.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from sriov_cni.daemon import install
from tests.support.daemonlib import REPO, SHIM

# Bytes a reference plugin binary carries: its Go module path.
REFERENCE_PLUGIN = b"\x7fELF fake go binary\x00github.com/k8snetworkplumbingwg/sriov-cni/pkg/sriov\x00" * 3


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from sriov_cni.cli import main; main()", "install-cni", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_misspelt_destination_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    (tmp_path / "opt" / "cni" / "bin").mkdir(parents=True)
    typo = tmp_path / "opt" / "cin" / "bin"
    proc = _cli("--dest", str(typo))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"Error: {typo} does not exist ({tmp_path / 'opt' / 'cin'} is missing): "
        "check the path, or pass --create-dest to create it"
    ]
    assert proc.stdout == ""
    assert sorted(p.name for p in (tmp_path / "opt").iterdir()) == ["cni"]


def test_create_dest_creates_the_destination(tmp_path: Path) -> None:
    dest = tmp_path / "opt" / "cni" / "bin"
    proc = _cli("--dest", str(dest), "--create-dest")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["sriov", "sriov-ipam"]
    assert proc.stderr == ""


def test_the_reference_plugin_is_replaced_with_one_line_and_kept(tmp_path: Path) -> None:
    dest = tmp_path / "bin"
    dest.mkdir()
    (dest / "sriov").write_bytes(REFERENCE_PLUGIN)
    (dest / "sriov").chmod(0o755)
    proc = _cli("--dest", str(dest))
    assert proc.returncode == 0, proc.stderr
    size = len(REFERENCE_PLUGIN)
    assert proc.stderr.splitlines() == [
        f"install-cni: replacing {dest / 'sriov'} (the reference Go sriov-cni plugin, {size} bytes); "
        f"the old file is kept as {dest / 'sriov.orig'}"
    ]
    assert sorted(p.name for p in dest.iterdir()) == ["sriov", "sriov-ipam", "sriov.orig"]
    assert (dest / "sriov").read_bytes() == SHIM.read_bytes()
    backup = dest / "sriov.orig"
    assert backup.read_bytes() == REFERENCE_PLUGIN
    assert stat.S_IMODE(backup.stat().st_mode) == 0o755, "the backup can be moved straight back"


def test_another_file_in_the_way_is_named_as_such(tmp_path: Path) -> None:
    dest = tmp_path / "bin"
    dest.mkdir()
    (dest / "sriov-ipam").write_text("#!/bin/sh\nexit 0\n")
    proc = _cli("--dest", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"install-cni: replacing {dest / 'sriov-ipam'} (a file sriov-cni did not write, 17 bytes); "
        f"the old file is kept as {dest / 'sriov-ipam.orig'}"
    ]


def test_our_own_executables_are_replaced_silently(tmp_path: Path) -> None:
    dest = tmp_path / "bin"
    dest.mkdir()
    # The Python scripts first, then the shim over them, then the shim again.
    install.install(str(dest), sys.executable)
    for _ in range(2):
        proc = _cli("--dest", str(dest))
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
    assert sorted(p.name for p in dest.iterdir()) == ["sriov", "sriov-ipam"]


def test_a_symlink_in_the_way_is_kept_as_a_symlink(tmp_path: Path) -> None:
    dest = tmp_path / "bin"
    dest.mkdir()
    (dest / "sriov").symlink_to("/usr/lib/cni/sriov")
    proc = _cli("--dest", str(dest))
    assert proc.returncode == 0, proc.stderr
    assert "(a symlink to /usr/lib/cni/sriov)" in proc.stderr
    assert (dest / "sriov.orig").readlink() == Path("/usr/lib/cni/sriov")
    assert not (dest / "sriov").is_symlink()


def test_the_library_reports_a_missing_destination_when_asked_not_to_create_it(tmp_path: Path) -> None:
    calls: list[install.Replaced] = []
    try:
        install.install(str(tmp_path / "nope"), create_dest=False, on_replace=calls.append)
    except install.MissingDestination as exc:
        assert exc.missing == str(tmp_path / "nope")
        assert str(exc) == f"{tmp_path / 'nope'} does not exist"
    else:
        raise AssertionError("a missing destination was created")
    assert not (tmp_path / "nope").exists() and calls == []
