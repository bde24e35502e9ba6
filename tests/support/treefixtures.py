"""Fixtures of a fake sysfs/procfs tree (see nodetree.py), for the node command's tests and the plugin's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sriov_cni.kernel import netlink, sysfs
from sriov_cni.paths import Paths
from sriov_cni.plugin import tuning
from tests.support.fakes import FakeHost, FakeLinks
from tests.support.nodetree import Tree


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    # Its attributes are plain files, which sysfs.write replaces as the
    # kernel replaces an attribute's value.
    return Tree(tmp_path / "root")


@pytest.fixture
def paths(tree: Tree, tmp_path: Path) -> Paths:
    """The tree's node paths, setup's state file in ``tmp_path``/run."""
    return tree.paths(tmp_path / "run" / "node.json")


@pytest.fixture
def links(tree: Tree) -> FakeLinks:
    return FakeLinks(tree)


@pytest.fixture
def writes(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every sysfs.write as (path relative to the tree root, value), still performed."""
    done: list[tuple[str, str]] = []
    real = sysfs.write

    def recording(path: Path, value: str) -> None:
        done.append((str(path.relative_to(tree.sys.parent)), value))
        real(path, value)

    monkeypatch.setattr(sysfs, "write", recording)
    return done


@pytest.fixture
def fake_netlink(tree: Tree, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Host namespace look-ups from the tree; run_in_netns runs here and records the namespace."""
    entered: list[str | None] = []

    @contextmanager
    def open_namespace(path: str | None = None) -> Iterator[FakeHost]:
        yield FakeHost(tree.sys)

    def run_in_netns(path: str | None, func: Callable[[], None], *, own_sysfs: Path | None = None) -> None:
        entered.append(path)
        func()

    monkeypatch.setattr(netlink, "open_namespace", open_namespace)
    monkeypatch.setattr(tuning, "run_in_netns", run_in_netns)
    return entered
