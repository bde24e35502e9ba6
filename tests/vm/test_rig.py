"""Host tests of the rig's watchdog, its rerun after a stall and its wire (tests/vm/rig.py, wirelib.py).

The guest is played by fakeguest.py, which runs the rig's run.sh as init
does; the command is a real pytest run with the rig's plugin, whose tests
pass, or stall as a guest does (the kernel's stall report, or silence).
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import GUEST_DIRS
from tests.vm import rig, wirelib

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
    # The fake guest's heartbeat may say a line between the stall and the
    # rig's look at it (a loaded machine): the stall is the last line else.
    said = [line for line in tail.splitlines() if line != "fakeguest: console alive"]
    assert said[-1] == STALL_LINES[0]
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


# What igbvf logged in the 6.1 guest: each VF's probe (at 2048 MiB, healthy),
# then, at 3072 MiB, where the VFs' registers read 0, VF 0's first down.
PROBES = [
    (4.118101, "igbvf 0000:01:10.0: enabling device (0000 -> 0002)"),
    (4.127902, "igbvf 0000:01:10.0: PF still in reset state. Is the PF interface up?"),
    (4.127998, "igbvf 0000:01:10.0: Assigning random MAC address."),
    (4.128236, "igbvf 0000:01:10.0: PF still resetting"),
    (4.137511, "igbvf 0000:01:10.2: PF still in reset state. Is the PF interface up?"),
    (4.137698, "igbvf 0000:01:10.2: PF still resetting"),
    (15.098769, "igbvf 0000:01:10.2: Link is Up 1000 Mbps Full Duplex"),
]
FIRST_DOWN = (26.550007, "igbvf 0000:01:10.0: PF still resetting")
# The line the guest's forwarder writes for it.
VF_STUCK_LINE = "vm-kmsg: [   26.550007] igbvf 0000:01:10.0: PF still resetting"
MEMORY_ON = 0x0406
# The stand-in for a broken VF clears the memory space bit.
MEMORY_OFF = 0x0404


def _pci_devices(root: Path, commands: dict[str, int]) -> Path:
    """A /sys/bus/pci/devices with these functions' COMMAND registers."""
    for name, command in commands.items():
        (root / name).mkdir(parents=True)
        (root / name / "config").write_bytes(bytes(4) + command.to_bytes(2, "little") + bytes(58))
    return root


def test_kmsg_records_give_their_time_and_text() -> None:
    record = b"6,1021,26550007,-;igbvf 0000:01:10.0: PF still resetting\n SUBSYSTEM=pci\n DEVICE=+pci:0000:01:10.0\n"
    seconds, text = rig.kmsg_message(record)
    assert (f"{seconds:.6f}", text) == ("26.550007", "igbvf 0000:01:10.0: PF still resetting")


def test_each_vf_may_fail_its_handshake_once_as_it_probes(tmp_path: Path) -> None:
    devices = _pci_devices(tmp_path, {"0000:01:10.0": MEMORY_ON, "0000:01:10.2": MEMORY_ON})
    assert list(rig.vf_reset_lines(PROBES, devices)) == []
    # Created again: each probe starts the count anew.
    assert list(rig.vf_reset_lines(PROBES + PROBES, devices)) == []


def test_a_vf_that_fails_its_handshake_again_is_forwarded(tmp_path: Path) -> None:
    devices = _pci_devices(tmp_path, {"0000:01:10.0": MEMORY_ON, "0000:01:10.2": MEMORY_ON})
    assert list(rig.vf_reset_lines([*PROBES, FIRST_DOWN], devices)) == [VF_STUCK_LINE]
    # Without a probe line first (as on kernels whose PF handshake at probe succeeds), from the second.
    assert list(rig.vf_reset_lines([FIRST_DOWN], devices)) == []
    assert list(rig.vf_reset_lines([(1.5, FIRST_DOWN[1]), FIRST_DOWN], devices)) == [VF_STUCK_LINE]


@pytest.mark.parametrize("commands", [{"0000:01:10.0": MEMORY_OFF}, {}], ids=["memory-space-off", "gone"])
def test_a_vf_broken_on_purpose_or_gone_is_not(tmp_path: Path, commands: dict[str, int]) -> None:
    devices = _pci_devices(tmp_path, commands)
    assert list(rig.vf_reset_lines([*PROBES, FIRST_DOWN, FIRST_DOWN], devices)) == []


def test_a_vf_broken_on_purpose_is_not_until_it_probes_again(tmp_path: Path) -> None:
    devices = _pci_devices(tmp_path, {"0000:01:10.0": MEMORY_OFF, "0000:01:10.2": MEMORY_ON})

    def messages() -> Iterator[tuple[float, str]]:
        yield from [*PROBES, FIRST_DOWN]
        # The test turns its memory space back on before the forwarder reads the next line.
        (devices / "0000:01:10.0" / "config").write_bytes(bytes(4) + MEMORY_ON.to_bytes(2, "little"))
        yield FIRST_DOWN
        yield from [*PROBES, FIRST_DOWN]

    assert list(rig.vf_reset_lines(messages(), devices)) == [VF_STUCK_LINE]


def test_a_forwarded_vf_failure_ends_the_boot() -> None:
    dog = rig.Watchdog(boot_deadline=600, quiet_limit=600)
    dog.feed(rig.COMMAND_STARTED + "\n")
    # igbvf's own line, as a test printing dmesg shows it, is not the forwarder's.
    dog.feed(f"[{FIRST_DOWN[0]:12.6f}] {FIRST_DOWN[1]}\n")
    assert (dog.vf_failure(), dog.verdict()) == (None, None)
    # After pytest's progress dots, which end without a newline.
    dog.feed("...." + VF_STUCK_LINE + "\n")
    verdict = dog.verdict()
    assert verdict is not None and verdict == dog.vf_failure()
    assert verdict.startswith("igb VF 0000:01:10.0 cannot come up: its reset handshake with the PF failed again")


@pytest.mark.parametrize("after", ["sleep 120", "exit 0"])
def test_a_vf_failure_fails_the_run_at_once(tmp_path: Path, after: str) -> None:
    # Whether the watchdog ends the boot or the command ends first.
    with pytest.raises(rig.RigError) as failed:
        _shell(tmp_path, f"echo '{VF_STUCK_LINE}'; {after}")
    message = str(failed.value)
    assert message.startswith("igb VF 0000:01:10.0 cannot come up:")
    assert "; a rig failure, not the command's; last console lines:\n" in message
    assert VF_STUCK_LINE in message.splitlines()
    # Not booted again: every boot would have the same VFs.
    assert (tmp_path / "results" / rig.PROGRESS_FILE).read_text() == "boot\t1\n"


def test_memory_above_the_limit_is_refused_before_booting(capsys: pytest.CaptureFixture[str]) -> None:
    assert rig.main(["--memory", "2816", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rig: igb VFs cannot come up with guest memory 2816 MiB, above 2815 MiB:")
    assert "--allow-broken-vfs for a test that wants VFs that never get a link" in err
    rig.check_memory(2815, allow_broken_vfs=False)
    rig.check_memory(3072, allow_broken_vfs=True)


def test_only_a_watched_guest_forwards_vf_failures() -> None:
    watched = rig._guest_script(["true"], "/src", "/share", rerun=False, watch_vfs=True)
    first = watched.splitlines()[0]
    assert "rig.forward_vf_resets()" in first and first.endswith(" </dev/null >/dev/console 2>&1 &")
    assert "forward_vf_resets" not in rig._guest_script(["true"], "/src", "/share", rerun=False)


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


def _netdevs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-netdev"]


def _art(tmp_path: Path) -> rig.Artifacts:
    return rig.Artifacts(kernel=tmp_path / "vmlinuz", initramfs=tmp_path / "initramfs", kernel_version="6.1.0")


def test_without_a_wire_each_pf_has_its_own_network(tmp_path: Path) -> None:
    argv = rig.qemu_command(_art(tmp_path), tmp_path, 3, 2048)
    assert _netdevs(argv) == ["user,id=net0,restrict=on", "user,id=net1,restrict=on", "user,id=net2,restrict=on"]
    assert "-object" not in argv


def test_a_wire_puts_every_pf_on_one_hub_recorded_at_pf0(tmp_path: Path) -> None:
    argv = rig.qemu_command(_art(tmp_path), tmp_path, 3, 2048, wire=True)
    assert _netdevs(argv) == [f"hubport,id=net{i},hubid=0" for i in range(3)]
    nics = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-device" and argv[i + 1].startswith("igb,")]
    assert [n.split(",")[2] for n in nics] == ["netdev=net0", "netdev=net1", "netdev=net2"]
    # Both ways on PF 0's port: what PF 0 sends, and what the hub repeats to
    # it from every other port.
    [dump] = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-object"]
    assert dump == f"filter-dump,id=wire,netdev=net0,queue=all,file={tmp_path / 'wire.pcap'}"


def test_only_a_wired_guest_is_told_where_its_capture_is(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host's own variable (passed through as any SRIOV_CNI_*) tells no guest of a wire.
    monkeypatch.setenv(rig.WIRE_ENV, "/elsewhere.pcap")
    wired = rig._guest_script(["true"], "/src", "/share", rerun=False, wire=True)
    assert f"{rig.WIRE_ENV}=/share/wire.pcap" in wired and "/elsewhere.pcap" not in wired
    assert rig.WIRE_ENV not in rig._guest_script(["true"], "/src", "/share", rerun=False)


def test_main_passes_wire_on(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[bool] = []

    def fake_run(command: list[str], **kw: object) -> rig.VmRun:
        asked.append(bool(kw["wire"]))
        return rig.VmRun(status=0, output="", stalls=[], left_out=0, tests=[], boot_seconds=[])

    monkeypatch.setattr(rig, "run_in_vm", fake_run)
    assert rig.main(["--wire", "--", "true"]) == 0
    assert rig.main(["--", "true"]) == 0
    assert asked == [True, False]


def _pcap(order: str, records: list[bytes]) -> bytes:
    """A pcap file as QEMU's filter-dump writes it, in byte ``order``."""
    out = struct.pack(f"{order}IHHiIII", wirelib.PCAP_MAGIC, 2, 4, 0, 0, 65536, wirelib.LINKTYPE_ETHERNET)
    for n, frame in enumerate(records):
        out += struct.pack(f"{order}IIII", 100 + n, 250000, len(frame), len(frame)) + frame
    return out


def _eth(src: str, tags: list[tuple[int, int]], ethertype: int, payload: bytes) -> bytes:
    head = bytes.fromhex("ffffffffffff") + bytes.fromhex(src.replace(":", ""))
    for tpid, tci in tags:
        head += struct.pack("!HH", tpid, tci)
    return head + struct.pack("!H", ethertype) + payload


# An IPv4 header (20 bytes, protocol ICMP) and an echo request's first 8 bytes.
ICMP_ECHO_REQUEST = bytes.fromhex("4500001c00004000400100000a0900020a0900010800000000010001")
# An IPv4 header (protocol UDP) and a UDP header to RoCE v2's port.
ROCE_V2 = bytes.fromhex("4500002400004000401100000a0900010a090002c00012b700100000")
ARP_WHO_HAS = bytes.fromhex("0001080006040001020000000a010a0900010000000000000a090002")


@pytest.mark.parametrize("order", ["<", ">"])
def test_the_wire_capture_is_read_record_by_record(tmp_path: Path, order: str) -> None:
    untagged = _eth("02:00:00:00:0a:01", [], 0x0806, ARP_WHO_HAS)
    # VLAN 100 with priority 3; then 802.1ad 7 outside 802.1Q 100 (QinQ).
    tagged = _eth("02:00:00:00:0a:01", [(0x8100, 3 << 13 | 100)], 0x0806, ARP_WHO_HAS)
    qinq = _eth("02:00:00:00:0b:01", [(0x88A8, 1 << 12 | 7), (0x8100, 100)], 0x0800, ICMP_ECHO_REQUEST)
    capture = tmp_path / "wire.pcap"
    whole = _pcap(order, [untagged, tagged, qinq])
    # The last record as QEMU is still writing it: left for a later read.
    capture.write_bytes(whole[:-5])
    wire = wirelib.Wire(capture)
    first = wire.since(wirelib.PCAP_HEADER)
    assert [f.tags for f in first] == [(), (wirelib.Tag(0x8100, 3, 0, 100),)]
    assert (first[0].src, first[0].dst, first[0].arp_target(), first[0].seconds) == (
        "02:00:00:00:0a:01",
        "ff:ff:ff:ff:ff:ff",
        "10.9.0.2",
        100.25,
    )
    mark = wire.mark()
    capture.write_bytes(whole)
    [last] = wire.since(mark)
    assert last.tags == (wirelib.Tag(0x88A8, 0, 1, 7), wirelib.Tag(0x8100, 0, 0, 100))
    assert (last.vids, last.ethertype, last.ipv4(), last.length) == ((7, 100), 0x0800, ("10.9.0.2", "10.9.0.1"), 50)
    assert (last.icmp_type(), first[0].icmp_type(), last.udp_ports()) == (wirelib.ICMP_ECHO_REQUEST, None, None)
    roce = wirelib.parse_frame(_eth("02:00:00:00:0a:01", [], 0x0800, ROCE_V2))
    assert (roce.udp_ports(), roce.icmp_type()) == ((49152, wirelib.ROCE_V2_PORT), None)
    assert wire.since(wire.mark()) == []


def test_a_capture_that_is_not_ethernet_pcap_is_refused(tmp_path: Path) -> None:
    capture = tmp_path / "wire.pcap"
    capture.write_bytes(b"\0" * 24)
    with pytest.raises(wirelib.PcapError, match="not a pcap file"):
        wirelib.Wire(capture)
    capture.write_bytes(struct.pack("<IHHiIII", wirelib.PCAP_MAGIC, 2, 4, 0, 0, 65536, 113))
    with pytest.raises(wirelib.PcapError, match="link type is 113"):
        wirelib.Wire(capture)


@pytest.fixture
def veth_pods() -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair, each end named ``net1`` and up (the real kernel)."""
    pods = (f"wirelib-{os.getpid()}-a", f"wirelib-{os.getpid()}-b")
    for pod in pods:
        subprocess.run(["ip", "netns", "add", pod], check=True)
    try:
        subprocess.run(
            ["ip", "-n", pods[0], "link", "add", "net1", "type", "veth", "peer", "net1", "netns", pods[1]], check=True
        )
        for pod in pods:
            subprocess.run(["ip", "-n", pod, "link", "set", "net1", "up"], check=True)
        yield pods
    finally:
        for pod in pods:
            subprocess.run(["ip", "netns", "delete", pod], check=False)


def test_a_listener_counts_what_a_pod_receives_until_the_sentinel(veth_pods: tuple[str, str]) -> None:
    sender, receiver = veth_pods
    listener = wirelib.Listener(receiver, "net1")
    wirelib.send_frames(sender, "net1", "02:00:00:00:aa:01", 3, dst="02:00:00:00:bb:01")
    wirelib.send_frames(sender, "net1", "02:00:00:00:aa:02", 2)
    wirelib.send_frames(sender, "net1", "02:00:00:00:aa:01", 1, ethertype=wirelib.ETH_P_SENTINEL)
    # What the receiver sends itself (IPv6 router solicitations, say) is not counted; the sentinel ends the count.
    got = sorted((r.src, r.dst, r.count) for r in listener.counts() if r.ethertype == wirelib.ETH_P_TEST)
    assert got == [("02:00:00:00:aa:01", "02:00:00:00:bb:01", 3), ("02:00:00:00:aa:02", wirelib.BROADCAST, 2)]


def test_a_peer_joins_its_hub_to_the_first_guests_by_udp_with_its_own_macs(tmp_path: Path) -> None:
    first = rig.qemu_command(_art(tmp_path), tmp_path, 2, 2048, wire=True, link=(40001, 40002))
    second = rig.qemu_command(_art(tmp_path), tmp_path / "peer", 2, 2048, wire=True, node=1, link=(40002, 40001))
    link = "dgram,id=link,local.type=inet,local.host=127.0.0.1,local.port={},remote.type=inet,remote.host=127.0.0.1,remote.port={}"
    assert _netdevs(first)[2:] == [link.format(40001, 40002), "hubport,id=uplink,hubid=0,netdev=link"]
    assert _netdevs(second)[2:] == [link.format(40002, 40001), "hubport,id=uplink,hubid=0,netdev=link"]

    def macs(argv: list[str]) -> list[str]:
        return [a.split("mac=")[1] for a in argv if a.startswith("igb,")]

    # One segment: no two PFs of the two nodes share a MAC.
    assert macs(first) == ["52:54:00:5a:00:01", "52:54:00:5a:00:02"]
    assert macs(second) == ["52:54:00:5a:01:01", "52:54:00:5a:01:02"]
    assert len(set(rig.free_udp_ports())) == 2


def test_a_peer_needs_the_wire(capsys: pytest.CaptureFixture[str]) -> None:
    assert rig.main(["--peer", "--", "true"]) == 2
    assert capsys.readouterr().err == "rig: --peer joins a second guest to the wire: give --wire too\n"


def test_only_the_first_guest_of_a_peer_run_is_told_where_the_other_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rig.PEER_ENV, "/elsewhere")
    first = rig._guest_script(["true"], "/src", "/share", rerun=False, wire=True, peer=True)
    assert f"{rig.PEER_ENV}=/share/peer" in first and "/elsewhere" not in first
    assert rig.PEER_ENV not in rig._guest_script(["true"], "/src", "/share", rerun=False, wire=True)


def test_the_second_guest_serves_the_first_until_the_rig_stops_it(tmp_path: Path) -> None:
    """Both guests played by fakeguest.py: the second runs wirelib's server, the first asks it."""
    second_dir = tmp_path / rig.PEER_SHARE
    second_dir.mkdir(parents=True)
    answers: list[subprocess.CompletedProcess[str]] = []

    def first() -> rig.VmRun:
        answers.append(wirelib.Peer(second_dir).run(["sh", "-c", 'cat; echo " $WHO"'], env={"WHO": "peer"}, stdin="hi"))
        return rig.VmRun(status=0, output="", stalls=[], left_out=0, tests=[], boot_seconds=[])

    run = rig.run_peer(
        first,
        second_dir,
        [sys.executable, str(HERE / "fakeguest.py"), str(second_dir)],
        timeout=120,
        quiet_limit=60,
        share=str(second_dir),
    )
    assert run.status == 0
    [answer] = answers
    assert (answer.returncode, answer.stdout) == (0, "hi peer\n")
    assert (second_dir / "status").read_text() == "0\n"
