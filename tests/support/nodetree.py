"""A temporary sysfs/procfs tree describing SR-IOV PFs, VFs and their IRQs.

Setup, status and the tuning hook are given its roots (:meth:`Tree.paths`),
so they read and write plain files laid out like the kernel's.  Writes that only the kernel could act on
(link up, MTU) go through :class:`tests.support.fakes.FakeLinks`, which
updates the tree the way the kernel would.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sriov_cni.paths import Paths


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Tree:
    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        self.proc = root / "proc"
        self.devices = self.sys / "bus" / "pci" / "devices"
        self.devices.mkdir(parents=True)
        self.cpus("0-7")
        _write(self.proc / "irq" / "default_smp_affinity", "ff\n")
        _write(self.proc / "sys" / "net" / "core" / "rps_sock_flow_entries", "0\n")

    def paths(self, state_file: Path, systemd_run: Path = Paths.systemd_run) -> Paths:
        """The node paths of this tree, with setup's state in ``state_file``."""
        return Paths(
            state_file=state_file,
            systemd_run=systemd_run,
            sys=self.sys,
            proc=self.proc,
            proc_irq=self.proc / "irq",
            modprobe_dir=self.sys.parent / "etc" / "modprobe.d",
        )

    def cpus(self, online: str, isolated: str = "", nohz_full: str = "") -> None:
        base = self.sys / "devices" / "system" / "cpu"
        _write(base / "online", online + "\n")
        _write(base / "isolated", isolated + "\n")
        _write(base / "nohz_full", nohz_full + "\n")

    def numa_node(self, node: int, cpus: str) -> None:
        _write(self.sys / "devices" / "system" / "node" / f"node{node}" / "cpulist", cpus + "\n")

    def irq(self, number: int, name: str, affinity: str = "0-7") -> None:
        d = self.proc / "irq" / str(number)
        _write(d / "smp_affinity_list", affinity + "\n")
        _write(d / "smp_affinity", "ff\n")
        if name:
            (d / name).mkdir()

    def _function(self, pci: str, driver: str | None, irqs: dict[int, str], numa: int) -> Path:
        d = self.devices / pci
        d.mkdir()
        if driver:
            os.symlink(f"../../../drivers/{driver}", d / "driver")
        _write(d / "numa_node", f"{numa}\n")
        (d / "msi_irqs").mkdir()
        for number, name in irqs.items():
            (d / "msi_irqs" / str(number)).write_text("msix\n")
            self.irq(number, name)
        return d

    def netdev(self, pci: str, name: str, rx: int = 1, tx: int = 1, mtu: int = 1500, up: bool = False) -> None:
        (self.devices / pci / "net" / name).mkdir(parents=True)
        d = self.sys / "class" / "net" / name
        d.mkdir(parents=True)
        os.symlink(self.devices / pci, d / "device")
        _write(d / "mtu", f"{mtu}\n")
        _write(d / "flags", "0x1003\n" if up else "0x1002\n")
        # A burned-in-looking MAC of its own per netdev name.
        _write(d / "address", "00:1b:21:" + ":".join(f"{ord(c) % 256:02x}" for c in (name + "  ")[-3:]) + "\n")
        for q in range(rx):
            _write(d / "queues" / f"rx-{q}" / "rps_cpus", "00\n")
            _write(d / "queues" / f"rx-{q}" / "rps_flow_cnt", "0\n")
        for q in range(tx):
            # The kernel hides xps_cpus on single-queue devices.
            (d / "queues" / f"tx-{q}").mkdir(parents=True)
            if tx > 1:
                _write(d / "queues" / f"tx-{q}" / "xps_cpus", "00\n")

    def pf(
        self,
        pci: str,
        netdev: str | None,
        *,
        total: int = 7,
        numvfs: int = 0,
        irqs: dict[int, str] | None = None,
        numa: int = -1,
        local: str = "0-7",
        queues: int = 1,
        mtu: int = 1500,
        up: bool = True,
        driver: str | None = "igb",
    ) -> None:
        d = self._function(pci, driver, irqs or {}, numa)
        _write(d / "sriov_totalvfs", f"{total}\n")
        _write(d / "sriov_numvfs", f"{numvfs}\n")
        _write(d / "local_cpulist", local + "\n")
        if netdev:
            self.netdev(pci, netdev, rx=queues, tx=queues, mtu=mtu, up=up)

    def vf(
        self,
        pf_pci: str,
        index: int,
        pci: str,
        netdev: str | None,
        irqs: dict[int, str] | None = None,
        driver: str = "igbvf",
    ) -> None:
        d = self._function(pci, driver, irqs or {}, -1)
        os.symlink(f"../{pf_pci}", d / "physfn")
        os.symlink(f"../{pci}", self.devices / pf_pci / f"virtfn{index}")
        if netdev:
            self.netdev(pci, netdev)

    def rdma(self, pci: str, name: str, *, uverbs: int | None = None, here: bool = True) -> None:
        """An RDMA device of a PCI function (mlx5, irdma, bnxt_re): <function>/infiniband/<name>.

        ``uverbs``: its character device's number, under the function's
        infiniband_verbs/ (ib_uverbs); ``here`` False: in another namespace
        (exclusive mode), so only that entry shows it.
        """
        if here:
            d = self.devices / pci / "infiniband" / name
            d.mkdir(parents=True)
            _write(d / "node_type", "1: CA\n")
        if uverbs is not None:
            v = self.devices / pci / "infiniband_verbs" / f"uverbs{uverbs}"
            v.mkdir(parents=True)
            _write(v / "ibdev", name + "\n")

    def affinity(self, irq: int) -> str:
        return (self.proc / "irq" / str(irq) / "smp_affinity_list").read_text().strip()

    def read(self, relative: str) -> str:
        return (self.sys / relative).read_text().strip()

    def igb(self, pci: str = "0000:01:00.0", netdev: str = "eth0", vfs: int = 0, **kw: Any) -> dict[int, str]:
        """An igb-like PF with ``vfs`` VFs: misc vector plus one TxRx vector per queue."""
        queues = kw.pop("queues", 1)
        bus = pci.split(":")[1]
        # PF on bus 1: IRQ 30 misc, 31.. queues; bus 2 from 40.  VFs from 100 * bus.
        first = 30 + 10 * (int(bus, 16) - 1)
        irqs = {first: netdev, **{first + 1 + q: f"{netdev}-TxRx-{q}" for q in range(queues)}}
        self.pf(pci, netdev, numvfs=vfs, irqs=irqs, queues=queues, **kw)
        out = {}
        for i in range(vfs):
            vf = f"0000:{bus}:10.{i}"
            base = 100 * int(bus, 16) + 3 * i
            self.vf(
                pci,
                i,
                vf,
                f"{netdev}v{i}",
                {base: f"{netdev}v{i}-tx-0", base + 1: f"{netdev}v{i}-rx-0", base + 2: f"{netdev}v{i}"},
            )
            out[i] = vf
        return out
