"""Suite-wide gate for tests that need the real igb/igbvf SR-IOV driver.

Tests marked ``sriov_vm`` only mean something inside the QEMU guest of
``tests/vm/rig.py``, which sets ``SRIOV_CNI_VM=1``.  Run directly on a host
they fail at setup instead of being skipped, so a skipped driver test can
never be mistaken for a passing one.

The guest collects only ``GUEST_DIRS`` (collecting the ~800 host tests under
TCG costs it about a minute), so a ``sriov_vm`` test anywhere else would
silently never run: collecting one there is an error.

Tests marked ``rdma_vm("7.2")`` (or another kernel series) are ``sriov_vm``
tests that need a guest on that newer kernel (``rig.py --kernel
sid|experimental``).  Outside a guest
they fail like ``sriov_vm`` tests; in a guest on another kernel they are
deselected (reported as such, never as passed), so one command line serves
each kernel's boot.  Likewise ``broken_vfs`` tests run only in a guest whose
VFs never come up (``SRIOV_CNI_VM_BROKEN_VFS=1``), and only they run there;
and ``wire_vm`` tests only in a guest whose PFs share a wire (``rig.py
--wire``, which sets ``SRIOV_CNI_VM_WIRE``), and only they run there.
``peer_vm`` tests need a second guest on that wire as well (``rig.py --wire
--peer``, which sets ``SRIOV_CNI_VM_PEER``); other wire tests run there too.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from tests.support.children import drop_caller_settings

# The fixtures every directory may use: a fake sysfs tree, a node of veth "VFs".
pytest_plugins = ("tests.support.treefixtures", "tests.support.nodefixtures", "tests.support.bpf")

VM_ENV = "SRIOV_CNI_VM"
# Set for a guest run with rig.py --allow-broken-vfs (the rig passes SRIOV_CNI_* on).
BROKEN_VFS_ENV = "SRIOV_CNI_VM_BROKEN_VFS"
# Set by rig.py --wire in its guest (rig.WIRE_ENV).
WIRE_ENV = "SRIOV_CNI_VM_WIRE"
# Set by rig.py --peer in the first of its two guests (rig.PEER_ENV).
PEER_ENV = "SRIOV_CNI_VM_PEER"

# tests/run.sh passes these to the guest's pytest.
GUEST_DIRS = ("tests/vm", "tests/stress")

RUN_HINT = (
    "sriov_vm tests need the emulated igb SR-IOV NIC: run them with "
    "`sudo tests/run.sh` or `python3 tests/vm/rig.py -- python3 -m pytest -m sriov_vm tests`"
)


RDMA_HINT = "rdma_vm tests need a guest on a newer kernel: `python3 tests/vm/rig.py --kernel sid|experimental -- ...`"


def pytest_configure(config: pytest.Config) -> None:
    # Before any test starts a child: the daemons, shims and plugins the
    # tests run read these, and get them only from the tests.
    drop_caller_settings(os.environ)


def kernel_series(release: str) -> str:
    """``7.2`` of ``7.2.13+deb14-amd64``, ``7.3`` of ``7.3-amd64``."""
    return ".".join(release.split("-", 1)[0].split("+", 1)[0].split(".")[:2])


def _rdma_series(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("rdma_vm")
    return None if marker is None else str(marker.args[0])


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("sriov_vm") is not None and os.environ.get(VM_ENV) != "1":
        pytest.fail(f"{item.nodeid}: {RUN_HINT}", pytrace=False)
    if _rdma_series(item) is not None and os.environ.get(VM_ENV) != "1":
        pytest.fail(f"{item.nodeid}: {RDMA_HINT}", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath)
    guest = [root / d for d in GUEST_DIRS]
    stray = sorted(
        {
            item.nodeid.split("::")[0]
            for item in items
            if (item.get_closest_marker("sriov_vm") is not None or _rdma_series(item) is not None)
            and not any(item.path.is_relative_to(d) for d in guest)
        }
    )
    if stray:
        raise pytest.UsageError(
            f"sriov_vm tests outside {', '.join(GUEST_DIRS)} never run in the guest: {', '.join(stray)}"
        )
    if os.environ.get(VM_ENV) == "1":
        series = kernel_series(platform.release())
        # A guest whose VFs never come up runs the broken_vfs tests alone,
        # and a guest with a wire the wire_vm tests alone; any other guest
        # runs all but them.
        broken = os.environ.get(BROKEN_VFS_ENV) == "1"
        wire = bool(os.environ.get(WIRE_ENV))
        peer = bool(os.environ.get(PEER_ENV))
        other = [
            item
            for item in items
            if _rdma_series(item) not in (None, series)
            or (item.get_closest_marker("broken_vfs") is not None) != broken
            or (item.get_closest_marker("wire_vm") is not None) != wire
            or (item.get_closest_marker("peer_vm") is not None and not peer)
        ]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if item not in other]
