"""Suite-wide gate for tests that need the real igb/igbvf SR-IOV driver.

Tests marked ``sriov_vm`` only mean something inside the QEMU guest of
``tests/vm/rig.py``, which sets ``SRIOV_CNI_VM=1``.  Run directly on a host
they fail at setup instead of being skipped, so a skipped driver test can
never be mistaken for a passing one.
"""

from __future__ import annotations

import os

import pytest

VM_ENV = "SRIOV_CNI_VM"

RUN_HINT = (
    "sriov_vm tests need the emulated igb SR-IOV NIC: run them with "
    "`sudo tests/run.sh` or `python3 tests/vm/rig.py -- python3 -m pytest -m sriov_vm tests`"
)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("sriov_vm") is not None and os.environ.get(VM_ENV) != "1":
        pytest.fail(f"{item.nodeid}: {RUN_HINT}", pytrace=False)
