"""The seeded fault-injection stress run (tests/stress/stress.py) as part of the suite.

Shorter versions of the documented runs: 1,000 operations on the host
fixtures, 200 on the guest's igb VFs through the shim and the daemon (which
also loses pods without a DEL, for the daemon to heal).  Each
fails with the seed, the summary line and every violation, and checks that
every fault kind it claims to inject was injected.
"""

from __future__ import annotations

import pytest

from tests.stress.stress import stress

SEED = 20261122
FAULTS = ("kill=", "netns_deleted=", "enospc=", "ipam_fail=", "duplicate_del=", "add_retry=")


def check(summary: str, violations: list[str], faults: tuple[str, ...]) -> None:
    print(summary)
    assert not violations, summary + "\n" + "\n".join(violations)
    for fault in faults:
        assert f" {fault}" in summary, summary


def test_host_stress() -> None:
    summary, violations = stress(1000, seed=SEED, node_kind="host", concurrency=4, vfs=8, deadline=5.0)
    check(summary, violations, FAULTS)


@pytest.mark.sriov_vm
def test_igb_stress() -> None:
    summary, violations = stress(200, seed=SEED, node_kind="igb", concurrency=6, vfs=7, deadline=20.0)
    # And pods lost without any DEL, whose VFs the daemon gives back.
    check(summary, violations, (*FAULTS, "pod_lost="))
    # The data path was checked, on VFs earlier pods had used.
    assert " pod pairs pinged=0 " not in summary and " pod pairs pinged=" in summary, summary
