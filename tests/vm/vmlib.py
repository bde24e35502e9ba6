"""Helpers for the igb guest's driver tests (used by tests/vm/conftest.py).

Test modules import them by their package path (``from tests.vm.vmlib import ...``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SYS_NET = Path("/sys/class/net")

# Under TCG the emulated PHY takes ~1-2 s to report link on a PF and ~8-10 s
# on a VF (igbvf polls the PF mailbox from a watchdog timer).
PF_CARRIER_TIMEOUT = 20.0
VF_CARRIER_TIMEOUT = 30.0
VF_PROBE_TIMEOUT = 30.0


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    """``ip -j ARGS`` (in ``netns`` if given), parsed."""
    cmd = ["ip", "-j"] + (["-n", netns] if netns else []) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    parsed: list[dict[str, Any]] = json.loads(out or "[]")
    return parsed


def pf_pci_dir(pf: str) -> Path:
    return (SYS_NET / pf / "device").resolve()


def numvfs(pf: str) -> int:
    return int((SYS_NET / pf / "device" / "sriov_numvfs").read_text())


def vf_pci_dirs(pf: str) -> list[Path]:
    """PCI device directories of the PF's current VFs, in VF index order."""
    dev = SYS_NET / pf / "device"
    return [(dev / f"virtfn{i}").resolve() for i in range(numvfs(pf))]


def is_sriov_igb(netdev: Path) -> bool:
    driver = netdev / "device" / "driver"
    return driver.exists() and driver.resolve().name == "igb" and (netdev / "device" / "sriov_totalvfs").exists()


class Sriov:
    """Creates VFs on igb PFs and restores the PFs afterwards (see module doc)."""

    def __init__(self, pfs: list[str]) -> None:
        self._pfs = pfs
        self._was_up = {pf: self._admin_up(pf) for pf in pfs}

    @staticmethod
    def _admin_up(ifname: str) -> bool:
        flags = int((SYS_NET / ifname / "flags").read_text(), 16)
        return bool(flags & 0x1)

    @staticmethod
    def _write_numvfs(pf: str, n: int) -> None:
        (SYS_NET / pf / "device" / "sriov_numvfs").write_text(str(n))

    def enable(self, pf: str, n: int, *, pf_up: bool = True) -> list[str]:
        """Create ``n`` VFs on ``pf``; return their netdev names, VF 0 first.

        With ``pf_up`` (the default) the PF is brought up and its carrier
        awaited first: igb only switches traffic between VFs, and accepts a
        VF ``max_tx_rate`` (EINVAL otherwise), once the PF link is up.
        Waits until igbvf has bound every VF and registered its netdev.
        """
        if pf_up:
            subprocess.run(["ip", "link", "set", pf, "up"], check=True)
            self.wait_carrier(pf, timeout=PF_CARRIER_TIMEOUT)
        # The kernel refuses to change a non-zero VF count directly (EBUSY).
        if numvfs(pf) not in (0, n):
            self.disable(pf)
        if numvfs(pf) != n:
            self._write_numvfs(pf, n)
            if pf_up:
                # igb closes and reopens a running PF to reconfigure its
                # queues for SR-IOV: the link drops and comes back ~0.5 s later.
                self.wait_carrier(pf, timeout=PF_CARRIER_TIMEOUT)
        dirs = vf_pci_dirs(pf)

        def all_probed() -> bool:
            return all((d / "net").is_dir() and any((d / "net").iterdir()) for d in dirs)

        wait_until(all_probed, VF_PROBE_TIMEOUT, f"{n} igbvf netdevs on {pf}")
        return [next((d / "net").iterdir()).name for d in dirs]

    def disable(self, pf: str) -> None:
        """Remove all VFs of ``pf`` and wait until their PCI devices are gone."""
        dirs = vf_pci_dirs(pf)
        self._write_numvfs(pf, 0)
        wait_until(lambda: not any(d.exists() for d in dirs), VF_PROBE_TIMEOUT, f"VFs of {pf} to go")

    @staticmethod
    def carrier(ifname: str, netns: str | None = None) -> bool:
        links = ip_json("link", "show", "dev", ifname, netns=netns)
        flags = links[0].get("flags", []) if links else []
        return isinstance(flags, list) and "LOWER_UP" in flags

    def wait_carrier(self, ifname: str, netns: str | None = None, timeout: float = VF_CARRIER_TIMEOUT) -> None:
        """Poll until ``ifname`` (in ``netns``) reports LOWER_UP."""
        where = f" in netns {netns}" if netns else ""
        wait_until(lambda: self.carrier(ifname, netns), timeout, f"carrier on {ifname}{where}")

    def restore(self) -> None:
        for pf in self._pfs:
            if numvfs(pf):
                self.disable(pf)
            if not self._was_up[pf]:
                subprocess.run(["ip", "link", "set", pf, "down"], check=True)
