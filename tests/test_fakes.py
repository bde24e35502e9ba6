"""The fakes of tests/support/fakes.py answer as what they stand in for.

FakeHost is the host namespace the plugin's allocation asks whether a VF's
netdev is there; here it and the kernel's namespace (a throwaway one with
veth ends of the same names) answer the same cases.  The VF store's fake
is held to the file store in test_vf_store.py, FakeVfControl to igb in
tests/vm/test_vfcontrol_igb.py.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from sriov_cni.kernel import netlink
from sriov_cni.plugin.allocate import Host
from tests.support.fakes import FakeHost
from tests.support.nodetree import Tree

PRESENT = ("eth0", "eth0v0")


@pytest.fixture(params=["fake", "kernel"])
def host(request: pytest.FixtureRequest) -> Iterator[Host]:
    """A host namespace holding the netdevs PRESENT and nothing else of those names."""
    if request.param == "fake":
        tree: Tree = request.getfixturevalue("tree")
        tree.igb(vfs=1)
        yield FakeHost(tree.sys)
        return
    if os.geteuid() != 0:
        pytest.fail("the kernel's side needs root (a network namespace)")
    ns = f"svfake-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for i, name in enumerate(PRESENT):
            subprocess.run(
                ["ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", f"peer{i}"], check=True
            )
        with netlink.open_namespace(f"/var/run/netns/{ns}") as inside:
            yield inside
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=True)


@pytest.mark.parametrize("name", PRESENT)
def test_a_netdev_that_is_there_is_found(host: Host, name: str) -> None:
    assert host.find(name) is not None


@pytest.mark.parametrize("name", ["eth1", "eth0v1", "eth0v"])
def test_a_netdev_that_is_not_there_is_not_found(host: Host, name: str) -> None:
    assert host.find(name) is None
