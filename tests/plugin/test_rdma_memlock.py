"""The ``rdmaMemlock`` network key: parsed, refused with code 7, and recorded at ADD for the daemon's NRI plugin."""

from __future__ import annotations

from typing import Any

import pytest

from sriov_cni.vfstore import read_allocations
from tests.support.pluginlib import Ready, refused


@pytest.mark.parametrize(("value", "recorded"), [(None, None), ("unlimited", None), ("64Mi", 64 << 20), ("1G", 10**9)])
def test_the_limit_is_recorded_with_the_attachment(ready: Ready, value: str | None, recorded: int | None) -> None:
    node, pod, _ = ready
    keys: dict[str, Any] = {} if value is None else {"rdmaMemlock": value}
    node.add(node.conf(**keys), netns=pod)
    (alloc,) = read_allocations(node.data_dir)
    assert alloc.rdma_memlock == recorded
    assert node.cni("DEL", node.conf(**keys), netns=pod).rc == 0


@pytest.mark.parametrize("value", ["lots", "0", "-1", "64 MiB", 65536, True, ""])
def test_anything_else_is_refused_with_nothing_changed(ready: Ready, value: object) -> None:
    node, pod, before = ready
    res = node.cni("ADD", node.conf(rdmaMemlock=value), netns=pod)
    refused(res, 7)
    assert 'rdmaMemlock must be "unlimited" or a size such as "64Mi"' in res.out["msg"]
    assert node.picture() == before
