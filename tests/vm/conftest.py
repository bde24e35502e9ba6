"""Fixtures for driver tests that run inside the igb QEMU guest (tests/vm/rig.py).

Mark such tests ``@pytest.mark.sriov_vm``; outside the guest they fail with a
hint to use ``tests/run.sh`` (see tests/conftest.py).

Fixtures:

``igb_pfs``
    Names of the guest's igb PF netdevs that can do SR-IOV (``eth0``, ``eth1``
    with the rig's default two PFs), sorted.
``sriov``
    An :class:`Sriov` controller: ``sriov.enable(pf, n)`` brings the PF up,
    creates ``n`` VFs and returns their netdev names in VF order;
    ``sriov.wait_carrier(ifname, netns)`` polls for a link's carrier.  At
    teardown every PF goes back to 0 VFs and its original admin state.
``node``
    A :class:`tests.vm.nodecommand.Node`: the ``sriov-cni`` node command with
    its config, state file and data directory in the test's tmp_path (the
    modules that start a daemon define a ``node`` of their own).
``netns``
    A factory: ``netns()`` creates a fresh named network namespace (``ip
    netns add``) and returns its name; all are deleted at teardown.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.vm.nodecommand import Node
from tests.vm.vmlib import SYS_NET, Sriov, is_sriov_igb


@pytest.fixture(scope="session")
def igb_pfs() -> list[str]:
    pfs = sorted(p.name for p in SYS_NET.iterdir() if is_sriov_igb(p))
    if not pfs:
        pytest.fail("no igb PF with sriov_totalvfs found; is this the rig's guest?")
    return pfs


@pytest.fixture
def sriov(igb_pfs: list[str]) -> Iterator[Sriov]:
    ctl = Sriov(igb_pfs)
    yield ctl
    ctl.restore()


_netns_ids = itertools.count()


@pytest.fixture
def netns() -> Iterator[Callable[[], str]]:
    created: list[str] = []

    def make() -> str:
        name = f"vmtest-{os.getpid()}-{next(_netns_ids)}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        created.append(name)
        return name

    yield make
    for name in created:
        subprocess.run(["ip", "netns", "delete", name], check=True)


@pytest.fixture
def node(tmp_path: Path, sriov: Sriov) -> Node:
    # ``sriov`` puts every PF back to 0 VFs at teardown.
    return Node(tmp_path)
