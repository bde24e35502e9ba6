"""Host tests of the rig's watchdog and its rerun after a stall (tests/vm/rig.py).

The guest is played by fakeguest.py, which runs the rig's run.sh as init
does; the command is a real pytest run with the rig's plugin, whose tests
pass, or stall as a guest does (the kernel's stall report, or silence).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import GUEST_DIRS
from tests.vm import rig

HERE = Path(__file__).resolve().parent

# Console lines of stuck guests: the first two as the 6.1 guest kernel
# printed them in the stall this watchdog was written for.
STALL_LINES = [
    "[ 1862.335121] rcu: rcu_preempt kthread timer wakeup didn't happen for 5251 jiffies! g49389 f0x0 "
    "RCU_GP_WAIT_FQS(5) ->state=0x402",
    "[ 2031.901127] INFO: task python3:4711 blocked for more than 120 seconds.",
    "[  301.020001] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
    "[  301.020001] rcu: INFO: rcu_preempt self-detected stall on CPU",
    "[  312.000000] rcu: rcu_preempt kthread starved for 10502 jiffies! g2245 f0x0 RCU_GP_WAIT_FQS(5)",
    "[  122.113204] watchdog: BUG: soft lockup - CPU#1 stuck for 22s! [python3:812]",
    "[  140.000000] BUG: workqueue lockup - pool cpus=0 node=0 flags=0x0 nice=0 stuck for 31s!",
]

# Lines a healthy guest prints that share words with the stall reports.
HEALTHY_LINES = [
    "[    0.061502] rcu: Preemptible hierarchical RCU implementation.",
    "[    0.061503] rcu: RCU calculated value of scheduler-enlistment delay is 25 jiffies.",
    "[    0.400000] rcu: Hierarchical SRCU implementation.",
    "tests/vm/test_rig.py::test_stall_signs_end_the_boot PASSED                 [ 12%]",
    "vm-init: running command",
]


@pytest.mark.parametrize("line", STALL_LINES)
def test_stall_signs_end_the_boot(line: str) -> None:
    dog = rig.Watchdog(boot_deadline=600, quiet_limit=600)
    dog.feed(rig.COMMAND_STARTED + "\n")
    dog.feed(line + "\n")
    assert dog.verdict() == f"the guest kernel reports a stall: {line}"


def test_healthy_lines_do_not() -> None:
    dog = rig.Watchdog(boot_deadline=600, quiet_limit=600)
    for line in HEALTHY_LINES:
        dog.feed(line + "\n")
    assert dog.command_started is not None
    assert dog.verdict() is None


def test_a_silent_command_ends_the_boot() -> None:
    dog = rig.Watchdog(boot_deadline=600, quiet_limit=0.2)
    dog.feed("Booting from ROM..." + rig.COMMAND_STARTED + "\n")
    assert dog.verdict() is None
    time.sleep(0.3)
    assert dog.verdict() == "the guest printed nothing for 0 s"
    dog.feed("tests/vm/test_x.py::test_y PASSED\n")
    assert dog.verdict() is None


def test_silence_before_the_command_is_the_boot_deadlines() -> None:
    dog = rig.Watchdog(boot_deadline=3, quiet_limit=0.1)
    dog.feed("SeaBIOS (version 1.16.3)\n")
    time.sleep(0.5)
    assert dog.verdict() is None
    time.sleep(3)
    assert dog.verdict() == "the guest did not start the command within 3 s"


@pytest.mark.parametrize(
    ("command", "at"),
    [
        (["python3", "-m", "pytest", "-v", "tests"], 3),
        (["/usr/bin/python3.11", "-m", "pytest"], 3),
        (["pytest", "-x"], 1),
        (["python3", "tests/stress/stress.py", "--node", "igb"], None),
        (["python3", "-m", "pip", "pytest"], None),
        (["bash", "-c", "pytest"], None),
    ],
)
def test_pytest_commands_are_recognised(command: list[str], at: int | None) -> None:
    assert rig.pytest_args_at(command) == at


DEMO = """
import sys
import time
from pathlib import Path

PROGRESS = Path({progress!r})


def test_a():
    pass


def test_b():
    starts = PROGRESS.read_text().count("start\\ttest_demo.py::test_b\\n")
    if {mode!r} == "always" or starts == 1:
        if {mode!r} == "silent":
            # The fake guest's console falls silent from here on.
            (PROGRESS.parent / "silent").touch()
        else:
            # On a line of its own: pytest's progress dots end without one.
            print("\\n" + {stall!r}, flush=True)
        time.sleep(120)


def test_c():
    pass
"""


def _demo(tmp_path: Path, mode: str, quiet_limit: float = 60) -> tuple[rig.VmRun, str]:
    """A pytest run of test_a, test_b, test_c through the rig and fakeguest.py.

    test_b stalls the first time it runs (``mode`` "once": prints a kernel
    stall report; "silent": prints nothing), or every time ("always").
    """
    work = tmp_path / "work"
    results = tmp_path / "results"
    work.mkdir()
    results.mkdir()
    (work / "pytest.ini").write_text("[pytest]\n")
    progress = results / rig.PROGRESS_FILE
    (work / "test_demo.py").write_text(DEMO.format(progress=str(progress), mode=mode, stall=STALL_LINES[0]))
    console = io.StringIO()
    run = rig.run_boots(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "test_demo.py"],
        str(work),
        results,
        [sys.executable, str(HERE / "fakeguest.py"), str(results)],
        str(results),
        timeout=300,
        quiet_limit=quiet_limit,
        console=console,
    )
    return run, console.getvalue()


def _outcomes(run: rig.VmRun) -> list[tuple[int, str, str | None]]:
    return [(t.boot, t.nodeid.removeprefix("test_demo.py::"), t.outcome) for t in run.tests]


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("once", f"the guest kernel reports a stall: {STALL_LINES[0]}"),
        ("silent", "the guest printed nothing for 2 s"),
    ],
)
def test_a_stall_reruns_what_had_not_passed(tmp_path: Path, mode: str, reason: str) -> None:
    run, console = _demo(tmp_path, mode, quiet_limit=2)
    assert run.status == 0
    assert run.stalls == [f"{reason}, during test_demo.py::test_b"]
    assert run.left_out == 1
    # test_a passed before the stall and is not run again; test_b, running
    # when the boot was ended, runs again, and test_c runs for the first time.
    assert _outcomes(run) == [
        (1, "test_a", "passed"),
        (1, "test_b", None),
        (2, "test_b", "passed"),
        (2, "test_c", "passed"),
    ]
    assert "2 passed, 1 deselected" in console
    # Both boots' output, the first ending where the stall began.
    assert run.output.count("test_demo.py") == 2
    assert "2 passed, 1 deselected" in run.output
    summary = "\n".join(rig.summary(run, 12.0))
    assert f"rig: a boot was ended: {reason}, during test_demo.py::test_b" in summary
    assert "rig: a second boot ran the tests that had not passed; 1 that had passed did not run again" in summary
    [module] = [line for line in summary.splitlines() if line.endswith("test_demo.py")]
    assert module.split()[2:] == ["s", "3", "tests", "test_demo.py"]
    assert "   2 boots   QEMU's start to the command's" in summary


def test_module_costs_add_up_every_boot() -> None:
    tests = [
        rig.TestRun("tests/vm/test_a.py::test_x", 1, "passed", 10.0),
        rig.TestRun("tests/vm/test_b.py::test_y[1]", 1, "failed", 30.0),
        rig.TestRun("tests/vm/test_a.py::test_z", 1, None, 0.0),
        rig.TestRun("tests/vm/test_a.py::test_z", 2, "passed", 25.5),
    ]
    assert rig.module_costs(tests) == [("tests/vm/test_a.py", 35.5, 2), ("tests/vm/test_b.py", 30.0, 1)]
    run = rig.VmRun(status=1, output="", stalls=[], left_out=0, tests=tests, boot_seconds=[50.0, 40.0])
    assert rig.summary(run, 200.0)[1:] == [
        "rig: seconds per test module (setup, call and teardown, every boot):",
        "rig:     35.5 s    2 tests  tests/vm/test_a.py",
        "rig:     30.0 s    1 tests  tests/vm/test_b.py",
        "rig:     90.0 s    2 boots   QEMU's start to the command's",
        "rig:     44.5 s             the rest (pytest's start-up and collection, power-off)",
    ]


def test_a_second_stall_fails_the_run_with_the_console(tmp_path: Path) -> None:
    with pytest.raises(rig.RigError) as failed:
        _demo(tmp_path, "always")
    message = str(failed.value)
    assert message.startswith(
        f"the guest stalled again: the guest kernel reports a stall: {STALL_LINES[0]}, during test_demo.py::test_b;"
    )
    _head, _, tail = message.partition("last console lines:\n")
    assert tail.splitlines()[-1] == STALL_LINES[0]
    assert "test_demo.py" in tail


def _shell(tmp_path: Path, script: str) -> rig.VmRun:
    work = tmp_path / "work"
    results = tmp_path / "results"
    work.mkdir()
    results.mkdir()
    return rig.run_boots(
        ["sh", "-c", script],
        str(work),
        results,
        [sys.executable, str(HERE / "fakeguest.py"), str(results)],
        str(results),
        timeout=300,
        quiet_limit=60,
        console=None,
    )


def test_a_run_without_stall_boots_once(tmp_path: Path) -> None:
    run = _shell(tmp_path, "echo hello; exit 3")
    assert (run.status, run.output, run.stalls, run.tests) == (3, "hello\n", [], [])
    assert len(run.boot_seconds) == 1
    assert rig.summary(run, 1.0) == ["rig: guest finished in 1.0 s, command status 3"]


def test_a_stalled_command_that_is_not_pytest_runs_again_whole(tmp_path: Path) -> None:
    # The work directory stands in for the guest's fresh overlay, except that
    # it keeps the count of runs.
    run = _shell(
        tmp_path,
        f"""
        n=$(cat runs 2>/dev/null || echo 0); echo $((n + 1)) >runs; echo "run $n"
        if [ "$n" = 0 ]; then echo '{STALL_LINES[1]}'; sleep 120; fi
    """,
    )
    assert (run.status, run.output, run.left_out, run.tests) == (0, f"run 0\n{STALL_LINES[1]}\nrun 1\n", 0, [])
    assert run.stalls == [f"the guest kernel reports a stall: {STALL_LINES[1]}"]
    assert rig.summary(run, 1.0)[1:] == [
        f"rig: a boot was ended: the guest kernel reports a stall: {STALL_LINES[1]}",
        "rig: a second boot ran the command again",
    ]


PLUGIN_DEMO = """
import pytest


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown fails")


def test_pass():
    pass


def test_fail():
    assert False


def test_skip():
    pytest.skip("not here")


def test_teardown(broken_teardown):
    pass
"""


def _plugin_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_plugin_demo.py").write_text(PLUGIN_DEMO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "rigplugin", "-p", "no:cacheprovider", *args, "test_plugin_demo.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_plugin_reports_each_outcome(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    proc = _plugin_run(tmp_path, "--rig-progress", str(progress))
    assert proc.returncode == 1, proc.stdout
    done = [line.split("\t") for line in progress.read_text().splitlines() if line.startswith("done")]
    assert [(d[1], d[3]) for d in done] == [
        ("passed", "test_plugin_demo.py::test_pass"),
        ("failed", "test_plugin_demo.py::test_fail"),
        ("skipped", "test_plugin_demo.py::test_skip"),
        ("failed", "test_plugin_demo.py::test_teardown"),
    ]
    assert all(float(d[2]) >= 0 for d in done)
    starts = [line for line in progress.read_text().splitlines() if line.startswith("start")]
    assert len(starts) == 4


def test_plugin_rerun_with_nothing_left_succeeds(tmp_path: Path) -> None:
    skip = tmp_path / "passed"
    names = ("test_pass", "test_fail", "test_skip", "test_teardown")
    skip.write_text("".join(f"test_plugin_demo.py::{n}\n" for n in names))
    proc = _plugin_run(tmp_path, "--rig-skip", str(skip))
    assert proc.returncode == 0, proc.stdout
    assert "4 deselected" in proc.stdout


def test_guest_script_adds_the_plugin_only_to_pytest(tmp_path: Path) -> None:
    script = rig._guest_script(["python3", "-m", "pytest", "-v", "tests"], "/src", "/share", rerun=True)
    assert (
        "python3 -m pytest -p rigplugin --rig-progress /share/progress --rig-skip /share/passed-before -v tests"
        in script
    )
    assert str(HERE) in script
    first = rig._guest_script(["python3", "-m", "pytest", "tests"], "/src", "/share", rerun=False)
    assert "--rig-progress /share/progress tests" in first and "--rig-skip" not in first
    other = rig._guest_script(["sh", "-c", "true"], "/src", "/share", rerun=True)
    assert "rigplugin" not in other and "sh -c true" in other


def test_run_sh_gives_the_guest_every_guest_directory() -> None:
    run_sh = (HERE.parent / "run.sh").read_text()
    assert f"-m sriov_vm {' '.join(GUEST_DIRS)} ||" in run_sh
