"""Fixtures of a host node of veth "VFs" in namespaces; the helpers are in pluginlib.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pluginlib import Node, Ready


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.fail("the plugin's host tests need root (network namespaces, veths)")
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def ready(node: Node) -> Ready:
    """A node with one PF of two VFs and a pod; returns the picture to compare with afterwards."""
    node.add_pf(2)
    pod = node.pod()
    return node, pod, node.picture()
