"""The seeded fault-injection stress run (tests/stress/stress.py) as part of the suite.

The host run is a shorter version of the documented 10,000-operation run;
the igb run drives the real driver in the QEMU guest through the warm
helper, so its faults include SIGKILLs of the helper's per-call child and
helper restarts.  Each fails with the seed and every violation.
"""

from __future__ import annotations

import pytest

from stress import stress

HOST_OPS = 1000
IGB_OPS = 500


def check(summary: str, violations: list[str]) -> None:
    print(summary)
    assert not violations, summary + "\n" + "\n".join(violations)
    assert " kill=" in summary and " netns_deleted=" in summary and " enospc=" in summary, summary


def test_host_stress() -> None:
    check(*stress(HOST_OPS, seed=20261122, node_kind="host", concurrency=4, vfs=8, deadline=5.0))


@pytest.mark.sriov_vm
def test_igb_stress() -> None:
    check(*stress(IGB_OPS, seed=20261122, node_kind="igb", concurrency=4, vfs=7, deadline=60.0))
