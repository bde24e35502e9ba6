"""``sriov-cni setup``/``status`` run in the igb guest, and the CPU and IRQ views its tests check.

Shared by test_setup_igb.py, test_irqbalance_igb.py and test_dpdk_igb.py:
the ``node`` fixture (a :class:`Node` whose PFs go back to 0 VFs at
teardown), the guest's online CPUs, /proc/interrupts, an IRQ's affinity and
a PF's VF netdevs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.vm.vmlib import vf_pci_dirs

SCRIPT = Path(__file__).resolve().parents[2] / "bin" / "sriov-cni"


def online() -> tuple[str, list[int]]:
    """The guest's online CPUs: the kernel's list text, and the CPU numbers."""
    text = Path("/sys/devices/system/cpu/online").read_text().strip()
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return text, cpus


class Node:
    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "node.yaml"
        self.state = tmp_path / "node.json"
        self.data = tmp_path / "data"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)

    def setup(self, yaml_text: str) -> subprocess.CompletedProcess[str]:
        self.config.write_text(yaml_text)
        return self.run(
            "setup", "--config", str(self.config), "--state-file", str(self.state), "--data-dir", str(self.data)
        )


def interrupts() -> dict[str, int]:
    """Action name -> IRQ number, from /proc/interrupts (an oracle independent of msi_irqs)."""
    out = {}
    for line in Path("/proc/interrupts").read_text().splitlines()[1:]:
        m = re.match(r"\s*(\d+):.*\s(\S+)\s*$", line)
        if m:
            out[m.group(2)] = int(m.group(1))
    return out


def affinity(irq: int) -> str:
    return Path(f"/proc/irq/{irq}/smp_affinity_list").read_text().strip()


def vf_netdevs(pf: str) -> list[str]:
    return [next((d / "net").iterdir()).name for d in vf_pci_dirs(pf)]
