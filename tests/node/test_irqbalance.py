"""Setup's irqbalance modes and status's view of it, with a stand-in irqbalance process.

The stand-in is a real process named ``irqbalance`` (a shell script of that
name) that records the signals it gets; the fake procfs links to its real
``/proc/<pid>``.  The policy script setup writes is run by ``/bin/sh`` the
way irqbalance runs it, on device paths of the fake sysfs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sriov_cni.cli import main
from sriov_cni.node import config as node_config
from sriov_cni.node import irqbalance
from sriov_cni.node import setup as node_setup
from sriov_cni.paths import Paths
from tests.support.children import default_signals, ignored_signals
from tests.support.fakes import FakeLinks
from tests.support.nodetree import Tree

TUNED = "pfs: [{pf: eth0, numVfs: 2, tuning: {}}, {pf: eth1, numVfs: 1}]"


class Balancer:
    """A stand-in irqbalance: logs SIGHUP, ends on SIGTERM, and stays a zombie until the test reaps it."""

    def __init__(self, tmp: Path, tree: Tree, *args: str, starting: int = 0) -> None:
        """``starting``: seconds before it sets its traps, as irqbalance's start before main() blocks SIGHUP."""
        tmp.mkdir(parents=True, exist_ok=True)
        exe = tmp / "irqbalance"
        # Ready only once its traps are set: a SIGHUP before that ends it.
        # SIGUSR1 writes a fence (see settled); its trap comes first, so
        # that a stand-in that takes SIGHUP takes SIGUSR1 too.
        exe.write_text(
            f"#!/bin/sh\nsleep {starting}\ntrap 'echo fence >> \"$0.log\"' USR1\n"
            "trap 'date +%s.%N >> \"$0.log\"' HUP\n"
            "trap 'exit 0' TERM\ndate +%s.%N > \"$0.ready\"\nwhile :; do sleep 0.05; done\n"
        )
        exe.chmod(0o755)
        self.log = tmp / "irqbalance.log"
        # Its signals start at their defaults, whatever the test run's are:
        # a shell cannot trap a signal ignored when it started.
        self.proc = subprocess.Popen([str(exe), *args], start_new_session=True, preexec_fn=default_signals)
        self.pid = self.proc.pid
        os.symlink(f"/proc/{self.pid}", tree.proc / str(self.pid))
        ready = tmp / "irqbalance.ready"
        if not starting:
            # The shell creates the file before date writes to it.
            wait(lambda: ready.exists() and ready.read_text().endswith("\n"), "the stand-in to set its traps")

    def lines(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def hups(self) -> list[float]:
        """When each SIGHUP arrived, in seconds after the stand-in started."""
        start = float((self.log.parent / "irqbalance.ready").read_text())
        return [float(t) - start for t in self.lines() if t != "fence"]

    def settled(self) -> list[float]:
        """hups() once every signal sent before this call has been taken.

        kill() returns once the signal is pending, and a process takes its
        pending signals lowest number first: SIGHUP (1) before SIGUSR1 (10),
        whose fence is therefore logged after every SIGHUP sent before it.
        """
        fences = self.lines().count("fence")
        os.kill(self.pid, signal.SIGUSR1)
        wait(lambda: self.lines().count("fence") > fences, "the stand-in to take its signals")
        return self.hups()


def wait(predicate: Callable[[], bool], what: str) -> None:
    """Polls predicate() until it holds.

    The stand-in takes a signal in milliseconds; the bound is for a stand-in
    that never will, far above what a loaded machine's scheduler delays.
    """
    deadline = time.monotonic() + 120
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def balancers(tree: Tree, tmp_path: Path) -> Iterator[Callable[..., Balancer]]:
    started: list[Balancer] = []

    def start(*args: str, starting: int = 0) -> Balancer:
        b = Balancer(tmp_path / f"balancer{len(started)}", tree, *args, starting=starting)
        started.append(b)
        return b

    yield start
    for b in started:
        # The whole group: a stand-in still starting has its sleep running.
        try:
            os.killpg(b.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        b.proc.wait()


@pytest.fixture
def node(tree: Tree) -> Tree:
    tree.igb(vfs=2)
    tree.igb("0000:02:00.0", "eth1", vfs=1)
    return tree


def setup(
    text: str,
    tmp_path: Path,
    links: FakeLinks,
    systemd_run: Path = Paths.systemd_run,
    said: list[str] | None = None,
) -> list[str]:
    """setup's progress lines; ``said`` gets the lines it says before a step that can take seconds."""
    out: list[str] = []
    paths = links.tree.paths(tmp_path / "run" / "node.json", systemd_run)
    plan = node_setup.plan(node_config.parse(text), paths, tmp_path / "data", links)
    node_setup.execute(plan, paths, out.append, (said if said is not None else []).append)
    return out


def script(tmp_path: Path) -> Path:
    return tmp_path / "run" / "irqbalance-policy"


def ask(policy: Path, devpath: Path | str, irq: int) -> subprocess.CompletedProcess[str]:
    """The policy script's answer, run as irqbalance runs it (popen of "exec SCRIPT PATH IRQ")."""
    return subprocess.run(["/bin/sh", "-c", f"exec {policy} {devpath} {irq}"], capture_output=True, text=True)


def test_the_policy_script_bans_tuned_pfs_and_their_vfs_only(node: Tree, links: FakeLinks, tmp_path: Path) -> None:
    setup(TUNED, tmp_path, links)
    devices = node.devices
    for devpath, answer in [
        (devices / "0000:01:00.0", "ban=true\n"),
        (devices / "0000:01:10.0", "ban=true\n"),  # VF 0 of the tuned eth0
        (devices / "0000:01:10.1", "ban=true\n"),
        (devices / "0000:02:00.0", ""),  # eth1 has no tuning, so nothing pins it
        (devices / "0000:02:10.0", ""),
        (node.sys, ""),  # irqbalance's path for an IRQ without a device
    ]:
        done = ask(script(tmp_path), devpath, 31)
        assert (done.returncode, done.stdout, done.stderr) == (0, answer, ""), devpath
    assert irqbalance.banned_pfs(script(tmp_path)) == {"0000:01:00.0"}


def test_the_stand_in_takes_sighup_when_the_suite_runs_under_nohup(balancers: Callable[..., Balancer]) -> None:
    # Real kernel: this process ignores SIGHUP as nohup makes it, and the
    # stand-in's dispositions are read from /proc.
    caller = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert signal.SIGHUP in ignored_signals(os.getpid())
        b = balancers("--foreground")
    finally:
        signal.signal(signal.SIGHUP, caller)
    assert signal.SIGHUP not in ignored_signals(b.pid)
    os.kill(b.pid, signal.SIGHUP)
    assert len(b.settled()) == 1


def test_ban_makes_the_irqbalance_using_the_script_rescan_once(
    node: Tree, links: FakeLinks, tmp_path: Path, balancers: Callable[..., Balancer]
) -> None:
    policy = script(tmp_path)
    ours = balancers("--foreground", "--interval=2", f"--policyscript={policy}")
    other = balancers("--foreground", "-l", str(tmp_path / "elsewhere"))
    said: list[str] = []
    out = setup(TUNED, tmp_path, links, said=said)
    assert said == [f"irqbalance (pid {ours.pid}): asking it to rescan (waiting up to 30 s for it to take the signal)"]
    assert out[:3] == [
        f"irqbalance: policy script {policy} bans the IRQs of 0000:01:00.0 and their VFs: written",
        f"irqbalance (pid {ours.pid}): uses the policy script: asked to rescan",
        f"warning: irqbalance (pid {other.pid}) runs without --policyscript={policy} and will move the pinned "
        "IRQs back: add that option to its arguments (IRQBALANCE_ARGS in /etc/default/irqbalance on Debian) "
        "and restart it, or set irqbalance: stop",
    ]
    [hup] = ours.settled()
    # irqbalance ignores SIGHUP until its first scan, one interval in.
    assert hup >= 2
    # The script as written then is what it asks; nothing new to ask again.
    again = setup(TUNED, tmp_path, links)
    assert again[0].endswith(": unchanged") and "rescan" not in again[1]
    assert (len(ours.settled()), other.settled()) == (1, [])


def test_ban_asks_a_starting_irqbalance_to_rescan_only_once_sighup_would_not_end_it(
    node: Tree, links: FakeLinks, tmp_path: Path, balancers: Callable[..., Balancer]
) -> None:
    # Setup's wait for the first scan (interval + 1 s after the start) ends
    # at 2 s; the stand-in would die of SIGHUP for its first 4 s, as a real
    # irqbalance does until main() blocks it (measured: killed by a SIGHUP
    # 50 ms after exec, not at 500 ms).
    ours = balancers("--foreground", "--interval=1", f"--policyscript={script(tmp_path)}", starting=4)
    out = setup(TUNED, tmp_path, links)
    assert out[1] == f"irqbalance (pid {ours.pid}): uses the policy script: asked to rescan"
    assert ours.proc.poll() is None
    assert len(ours.settled()) == 1


def test_ban_leaves_an_irqbalance_that_never_takes_sighup_running_and_says_so(
    node: Tree, tmp_path: Path, balancers: Callable[..., Balancer]
) -> None:
    ours = balancers("--foreground", "--interval=1", f"--policyscript={script(tmp_path)}", starting=600)
    out = irqbalance.ban(node.proc, script(tmp_path), ["0000:01:00.0"], hup_timeout=1.0)
    assert out[1] == (
        f"warning: irqbalance (pid {ours.pid}) uses the policy script but took no SIGHUP within 1 s (still starting, "
        "or ended), so it was not asked to rescan: restart it"
    )
    assert ours.proc.poll() is None


def test_a_later_run_without_tuning_lifts_the_bans(node: Tree, links: FakeLinks, tmp_path: Path) -> None:
    untuned = "pfs: [{pf: eth0, numVfs: 2}]"
    setup(untuned, tmp_path, links)
    assert not script(tmp_path).exists()  # nothing pinned, nothing to ban
    setup(TUNED, tmp_path, links)
    out = setup(untuned, tmp_path, links)
    assert out[0] == f"irqbalance: policy script {script(tmp_path)} bans the IRQs of no PF and their VFs: written"
    assert ask(script(tmp_path), node.devices / "0000:01:00.0", 31).stdout == ""


def test_stop_without_systemd_ends_irqbalance(
    node: Tree, links: FakeLinks, tmp_path: Path, balancers: Callable[..., Balancer]
) -> None:
    no_systemd = tmp_path / "no-systemd"
    b = balancers("--foreground")
    said: list[str] = []
    out = setup("irqbalance: stop\n" + TUNED, tmp_path, links, no_systemd, said)  # sees the unreaped zombie as ended
    assert said == [f"irqbalance: stopping pid {b.pid} (waiting up to 10 s)"]
    assert out[0] == (
        f"irqbalance: stopped pid {b.pid} (no systemd: nothing to disable, it stays off until something starts it "
        "again)"
    )
    assert b.proc.poll() == 0
    assert not script(tmp_path).exists()
    assert setup("irqbalance: stop\n" + TUNED, tmp_path, links, no_systemd)[0] == "irqbalance: not running: unchanged"


def test_stop_under_systemd_disables_the_unit(
    node: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    systemd = tmp_path / "systemd"
    systemd.mkdir()
    # A systemctl that records its calls; the unit counts as enabled.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n')
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    out = setup("irqbalance: stop\n" + TUNED, tmp_path, links, systemd)
    assert out[0] == "irqbalance: irqbalance.service stopped and disabled"
    assert (tmp_path / "calls").read_text().splitlines() == [
        "is-enabled --quiet irqbalance.service",
        "disable --now irqbalance.service",
    ]


def test_leave_warns_with_what_to_do(
    node: Tree, links: FakeLinks, tmp_path: Path, balancers: Callable[..., Balancer]
) -> None:
    b = balancers("--foreground")
    out = setup("irqbalance: leave\npfs: [{pf: eth0, numVfs: 2, tuning: {}}]", tmp_path, links)
    assert out[-1].startswith(f"warning: irqbalance (pid {b.pid}) is running and will move the pinned IRQs back")
    assert 'IRQBALANCE_ARGS="--banirq=31"' in out[-1]
    assert not script(tmp_path).exists() and b.proc.poll() is None and b.settled() == []


def test_status_says_per_pf_whether_irqbalance_bans_its_irqs(
    node: Tree, links: FakeLinks, tmp_path: Path, balancers: Callable[..., Balancer], fake_netlink: list[str | None]
) -> None:
    setup(TUNED, tmp_path, links)
    b = balancers("--foreground", f"--policyscript={script(tmp_path)}")
    result = CliRunner().invoke(
        main,
        ["status", "--json", "--data-dir", str(tmp_path / "data")],
        obj=links.tree.paths(tmp_path / "run" / "node.json"),
    )
    pf0, pf1 = json.loads(result.output)["pfs"]
    assert (pf0["irqbalance"], pf1["irqbalance"]) == (
        {"pids": [b.pid], "banned": True},
        {"pids": [b.pid], "banned": False},
    )
    # A second irqbalance without the script makes no PF safe.
    other = balancers("--foreground")
    lines = (
        CliRunner()
        .invoke(
            main, ["status", "--data-dir", str(tmp_path / "data")], obj=links.tree.paths(tmp_path / "run" / "node.json")
        )
        .output.splitlines()
    )
    pf_lines = [line for line in lines if line.startswith("PF ")]
    assert [line.split("  ")[6] for line in pf_lines] == [
        f"irqbalance on (pid {b.pid}, {other.pid}), IRQs NOT banned"
    ] * 2
