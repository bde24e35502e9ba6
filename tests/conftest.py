"""Suite-wide gate for tests that need the real igb/igbvf SR-IOV driver.

Tests marked ``sriov_vm`` only mean something inside the QEMU guest of
``tests/vm/rig.py``, which sets ``SRIOV_CNI_VM=1``.  Run directly on a host
they fail at setup instead of being skipped, so a skipped driver test can
never be mistaken for a passing one.

The guest collects only ``GUEST_DIRS`` (collecting the ~800 host tests under
TCG costs it about a minute), so a ``sriov_vm`` test anywhere else would
silently never run: collecting one there is an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The fixtures every directory may use: a fake sysfs tree, a node of veth "VFs".
pytest_plugins = ("tests.support.treefixtures", "tests.support.nodefixtures", "tests.support.bpf")

VM_ENV = "SRIOV_CNI_VM"

# tests/run.sh passes these to the guest's pytest.
GUEST_DIRS = ("tests/vm", "tests/stress")

RUN_HINT = (
    "sriov_vm tests need the emulated igb SR-IOV NIC: run them with "
    "`sudo tests/run.sh` or `python3 tests/vm/rig.py -- python3 -m pytest -m sriov_vm tests`"
)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("sriov_vm") is not None and os.environ.get(VM_ENV) != "1":
        pytest.fail(f"{item.nodeid}: {RUN_HINT}", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(config.rootpath)
    guest = [root / d for d in GUEST_DIRS]
    stray = sorted(
        {
            item.nodeid.split("::")[0]
            for item in items
            if item.get_closest_marker("sriov_vm") is not None and not any(item.path.is_relative_to(d) for d in guest)
        }
    )
    if stray:
        raise pytest.UsageError(
            f"sriov_vm tests outside {', '.join(GUEST_DIRS)} never run in the guest: {', '.join(stray)}"
        )
