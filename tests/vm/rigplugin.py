"""The rig's pytest plugin, loaded in the guest when the rig's command is pytest.

``--rig-progress FILE`` appends one line per test to FILE (on the rig's
results share, so the host sees each line as soon as it is written):
``start<TAB>NODEID`` as the test begins, ``done<TAB>OUTCOME<TAB>SECONDS<TAB>NODEID``
once its teardown has run, with the setup, call and teardown times summed.
OUTCOME is ``passed`` only if all three phases passed, else the outcome
of the first phase that did not (``failed``, ``skipped``).  The rig reads the
file to name the test a stalled guest was running, to sum each module's
cost, and, when it boots the guest again after a stall, to know which tests
passed already.

``--rig-skip FILE`` deselects the tests FILE lists (one node id a line): the
ones that passed in the boot before.  The test that was running when that
boot stalled is not among them, so it runs again.  A rerun in which nothing
is left to run succeeds instead of ending with pytest's "no tests collected".
"""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rig", "the test guest's rig (tests/vm/rig.py)")
    group.addoption("--rig-progress", metavar="FILE", help="append each test's start and outcome to FILE")
    group.addoption("--rig-skip", metavar="FILE", help="deselect the node ids FILE lists")


def pytest_configure(config: pytest.Config) -> None:
    progress = config.getoption("rig_progress")
    skip = config.getoption("rig_skip")
    if progress or skip:
        config.pluginmanager.register(
            Recorder(Path(progress) if progress else None, Path(skip) if skip else None), "rig-recorder"
        )


class Recorder:
    def __init__(self, progress: Path | None, skip: Path | None) -> None:
        self.progress = progress
        self.skip = skip
        self.deselected = 0
        # Per test being run: seconds spent so far, and its outcome: "passed"
        # until a phase ends otherwise, then that phase's outcome.
        self.spent: dict[str, tuple[float, str]] = {}

    def _append(self, *fields: str) -> None:
        if self.progress is None:
            return
        # Opened for each line: the host reads the file while the guest runs,
        # and a stall must not leave a finished test's line in a buffer.
        with self.progress.open("a") as f:
            f.write("\t".join(fields) + "\n")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if self.skip is None:
            return
        passed = set(self.skip.read_text().splitlines())
        gone = [item for item in items if item.nodeid in passed]
        if gone:
            self.deselected = len(gone)
            config.hook.pytest_deselected(items=gone)
            items[:] = [item for item in items if item.nodeid not in passed]

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._append("start", nodeid)
        self.spent[nodeid] = (0.0, "passed")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        seconds, outcome = self.spent[report.nodeid]
        if outcome == "passed":
            outcome = report.outcome
        self.spent[report.nodeid] = (seconds + report.duration, outcome)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        seconds, outcome = self.spent.pop(nodeid)
        self._append("done", outcome, f"{seconds:.2f}", nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and self.deselected:
            session.exitstatus = pytest.ExitCode.OK
