"""The seeded fault-injection stress run (tests/stress/stress.py) as part of the suite.

A shorter version of the documented 10,000-operation host run.  It fails
with the seed, the summary line and every violation.
"""

from __future__ import annotations

from stress import stress

HOST_OPS = 1000


def test_host_stress() -> None:
    summary, violations = stress(HOST_OPS, seed=20261122, node_kind="host", concurrency=4, vfs=8, deadline=5.0)
    print(summary)
    assert not violations, summary + "\n" + "\n".join(violations)
    # The run must have exercised what it claims to: each fault kind at least once.
    for fault in ("kill=", "netns_deleted=", "enospc=", "ipam_fail=", "duplicate_del=", "add_retry="):
        assert f" {fault}" in summary, summary
