"""Debian's irqbalance, really running, against the IRQs setup and the VF hook pin (igb guest).

irqbalance runs in the foreground with a 1 s interval and is told never to
use CPU ``PIN`` (``IRQBALANCE_BANNED_CPULIST``), the CPU we pin to: every
IRQ it manages leaves that CPU, so a pin it took is seen at once, and an
IRQ we did not pin (the untuned PF's queue IRQ, put on ``PIN`` by the test)
moving off proves it was active.  Its scans are counted in its own log
("-----" per scan), so "several intervals" means scans seen, not time slept.
The guest has no systemd: ``stop`` sends SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sriov_cni.kernel import sysfs
from sriov_cni.paths import Paths
from sriov_cni.plugin import tuning
from tests.vm.nodecommand import Node, affinity, interrupts, online, vf_netdevs
from tests.vm.vmlib import vf_pci_dirs, wait_until

pytestmark = pytest.mark.sriov_vm

SCAN_TIMEOUT = 60.0  # several 1 s intervals under TCG on a shared host


def pin_cpu() -> int:
    _, cpus = online()
    if len(cpus) < 2:
        pytest.fail(f"irqbalance needs two CPUs, the guest has {cpus}")
    return cpus[-1]


class Irqbalance:
    def __init__(self, log: Path, policy_script: Path, banned_cpu: int) -> None:
        self.log = log
        # --debug is --foreground plus its log on stdout (scans, bans), line-buffered for the test to read.
        self.args = ["stdbuf", "-oL", "irqbalance", "--debug", "--interval=1", f"--policyscript={policy_script}"]
        self.env = {**os.environ, "IRQBALANCE_BANNED_CPULIST": str(banned_cpu)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def scans(self) -> int:
        return self.log.read_text(errors="replace").count("-----\n") if self.log.exists() else 0

    def wait_scans(self, n: int) -> None:
        """Wait until irqbalance has looked at the IRQs ``n`` more times."""
        target = self.scans() + n
        wait_until(lambda: self.scans() >= target, SCAN_TIMEOUT, f"{n} irqbalance scans")

    def banned(self) -> set[int]:
        return {int(m) for m in re.findall(r"IRQ (\d+) was BANNED", self.log.read_text(errors="replace"))}


@pytest.fixture
def balancer(node: Node, tmp_path: Path) -> Iterator[Irqbalance]:
    b = Irqbalance(tmp_path / "irqbalance.log", node.state.parent / "irqbalance-policy", pin_cpu())
    yield b
    b.end()


def queue_irqs(pf: str) -> list[int]:
    return [irq for name, irq in interrupts().items() if re.fullmatch(rf"{pf}-(TxRx|rx|tx)-\d+", name)]


def moved_off(irq: int, cpu: int) -> None:
    """Wait until irqbalance has put ``irq`` somewhere without ``cpu``: proof that it is at work."""
    wait_until(
        lambda: str(cpu) not in affinity(irq).split(","), SCAN_TIMEOUT, f"irqbalance to move IRQ {irq} off CPU {cpu}"
    )


def control_irq(pf: str, cpu: int) -> int:
    """A queue IRQ of the untuned PF, put on ``cpu`` for irqbalance to move."""
    subprocess.run(["ip", "link", "set", pf, "up"], check=True)
    irq = queue_irqs(pf)[0]
    Path(f"/proc/irq/{irq}/smp_affinity_list").write_text(str(cpu))
    return irq


def start_active(balancer: Irqbalance, untuned: str, cpu: int) -> None:
    """Start irqbalance and wait until it has moved the untuned PF's queue IRQ off ``cpu``."""
    control = control_irq(untuned, cpu)
    balancer.start()
    moved_off(control, cpu)


def setup(node: Node, mode: str, tuned: str, untuned: str, cpu: int, vfs: int) -> str:
    """``sriov-cni setup`` with ``config``, which must succeed; its output."""
    done = node.setup(config(mode, tuned, untuned, cpu, vfs))
    assert done.returncode == 0, done.stderr
    return done.stdout


def config(mode: str, tuned: str, untuned: str, cpu: int, vfs: int) -> str:
    return f"""
irqbalance: {mode}
pfs:
  - pf: {tuned}
    numVfs: {vfs}
    tuning: {{irqCpus: "{cpu}"}}
  - pf: {untuned}
    numVfs: {vfs}
"""


def vf_up_in(ns: str, pf: str, index: int) -> str:
    """VF ``index`` of ``pf`` moved into ``ns`` as net1 and up, as ADD leaves it; its PCI address."""
    name = vf_netdevs(pf)[index]
    subprocess.run(["ip", "link", "set", name, "netns", ns], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", name, "name", "net1"], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", "net1", "up"], check=True)
    return vf_pci_dirs(pf)[index].name


def assert_ours(pins: list[int], cpu: int) -> None:
    assert {irq: affinity(irq) for irq in pins} == {irq: str(cpu) for irq in pins}


def test_ban_holds_from_before_setup_through_vf_irqs_and_a_restart(
    node: Node, igb_pfs: list[str], netns: Callable[[], str], balancer: Irqbalance
) -> None:
    pf0, pf1 = igb_pfs
    cpu = pin_cpu()
    start_active(balancer, pf1, cpu)
    out = setup(node, "ban", pf0, pf1, cpu, 1)
    assert f"irqbalance (pid {balancer.pid}): uses the policy script: asked to rescan" in out
    pins = queue_irqs(pf0)
    assert_ours(pins, cpu)

    # A pod's VF on each PF comes up: irqbalance meets their IRQs only now.
    vf0 = vf_up_in(netns(), pf0, 0)
    assert (
        tuning.apply_vf_tuning(Paths(state_file=node.state), sysfs.resolve_vf(Paths().sys, vf0), "", "net1") == []
    )  # no RPS/XPS policy: the pod side is not entered
    names = interrupts()
    pins += [names["net1-rx-0"], names["net1-tx-0"]]
    assert_ours(pins, cpu)
    vf_up_in(netns(), pf1, 0)
    # The untuned PF's VF is named net1 too; find its IRQs by PCI address.
    other = [int(n) for n in os.listdir(vf_pci_dirs(pf1)[0] / "msi_irqs")]
    for irq in other:
        moved_off(irq, cpu)
    balancer.wait_scans(3)
    assert_ours(pins, cpu)
    assert set(pins) <= balancer.banned()

    # Restarted: the new irqbalance asks the script about every IRQ anew.
    balancer.end()
    start_active(balancer, pf1, cpu)
    balancer.wait_scans(3)
    assert_ours(pins, cpu)

    status = node.run("status", "--json", "--data-dir", str(node.data))
    assert status.returncode == 0, status.stderr
    shown = {p["netdev"]: p["irqbalance"] for p in json.loads(status.stdout)["pfs"]}
    pid = balancer.pid
    assert (shown[pf0], shown[pf1]) == ({"pids": [pid], "banned": True}, {"pids": [pid], "banned": False})


def test_ban_holds_with_irqbalance_started_after_setup(node: Node, igb_pfs: list[str], balancer: Irqbalance) -> None:
    pf0, pf1 = igb_pfs
    cpu = pin_cpu()
    setup(node, "ban", pf0, pf1, cpu, 0)
    pins = queue_irqs(pf0)
    assert_ours(pins, cpu)
    start_active(balancer, pf1, cpu)
    balancer.wait_scans(3)
    assert_ours(pins, cpu)


def test_leave_lets_irqbalance_take_the_pins_and_stop_ends_it(
    node: Node, igb_pfs: list[str], balancer: Irqbalance
) -> None:
    pf0, pf1 = igb_pfs
    cpu = pin_cpu()
    start_active(balancer, pf1, cpu)
    assert f"warning: irqbalance (pid {balancer.pid}) is running" in setup(node, "leave", pf0, pf1, cpu, 0)
    pins = queue_irqs(pf0)
    # Without a ban, the next rescan (what any irqbalance restart or IRQ
    # change brings) takes the pins: what the ban tests would see if it failed.
    os.kill(balancer.pid, signal.SIGHUP)
    for irq in pins:
        moved_off(irq, cpu)

    stopped = setup(node, "stop", pf0, pf1, cpu, 0)
    assert stopped.splitlines()[0] == (
        f"irqbalance: stopped pid {balancer.pid} (no systemd: nothing to disable, it stays off until something starts it again)"
    )
    assert not balancer.running()
    assert_ours(pins, cpu)  # pinned again, after irqbalance ended
    status = node.run("status", "--json", "--data-dir", str(node.data))
    assert all(p["irqbalance"] == {"pids": [], "banned": False} for p in json.loads(status.stdout)["pfs"])
