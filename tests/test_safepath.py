"""safepath.replace_file, the one way files readers trust whole are written (records, node state, executables)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sriov_cni import safepath


def test_the_new_file_takes_the_mode_asked_for_whatever_the_umask_or_a_leftover(tmp_path: Path) -> None:
    target = tmp_path / "node.json"
    target.write_text("old\n")
    # A writer killed before its rename left its temporary file, longer and
    # with another mode; this process may have the same pid as that one.
    leftover = tmp_path / f".node.json.{os.getpid()}.tmp"
    leftover.write_text("a much longer leftover from a killed writer\n")
    leftover.chmod(0o600)
    old_umask = os.umask(0o077)
    try:
        safepath.replace_file(target, b"new\n", 0o755)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.json"]


def test_a_reader_keeps_the_file_it_opened_and_the_next_open_gets_the_new_one(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    safepath.replace_file(target, b"first", 0o600, sync=False)
    with open(target, "rb") as reader:
        safepath.replace_file(target, b"second", 0o600)
        assert reader.read() == b"first"
    assert target.read_bytes() == b"second"


def test_a_failed_replace_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("kept\n")
    with pytest.raises(IsADirectoryError):
        safepath.replace_file(target, b"data", 0o600)
    assert (target / "inside").read_text() == "kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
