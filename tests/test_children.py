"""A test's child processes get the environment the test gives them, not the suite's caller's.

Real processes: a child started with the suite's environment prints what
it has.  The variables are set here as a caller would have them when
pytest started; conftest's scrub (run again here) is what is tested.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.children import drop_caller_settings


def test_the_callers_cni_and_daemon_settings_do_not_reach_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CNI_COMMAND", "SRIOV_CNI_SOCKET", "SRIOV_CNI_DAEMON_STATS", "SRIOV_CNI_VM_CACHE"):
        monkeypatch.setenv(name, "from-the-caller")
    assert drop_caller_settings(os.environ) == ["CNI_COMMAND", "SRIOV_CNI_DAEMON_STATS", "SRIOV_CNI_SOCKET"]
    code = "import os; print(sorted(n for n in os.environ if n.startswith(('CNI_', 'SRIOV_CNI_'))))"
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # The rig's markers stay: the guest's tests read them.
    assert seen.strip() == "['SRIOV_CNI_VM_CACHE']"
