"""The pool a network takes its VFs from: ``pfNames`` entries and the VFs they name."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sriov_cni.cni import CNIError, Code, shown, validate_ifname
from sriov_cni.kernel import sysfs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolEntry:
    """One ``pfNames`` entry: a PF (netdev name or PCI address) and optional VF index runs."""

    pf: str
    # Sorted, merged ``(first, last)`` runs; None: every VF of the PF.  Kept
    # as runs: "#0-65535" is 8 bytes of config, and 65536 numbers for each
    # such entry would make a config's cost grow far beyond its size.
    runs: tuple[tuple[int, int], ...] | None

    def __str__(self) -> str:
        if self.runs is None:
            return self.pf
        return f"{self.pf}#{','.join(str(a) if a == b else f'{a}-{b}' for a, b in self.runs)}"


_RANGE = re.compile(r"([0-9]{1,6})(?:-([0-9]{1,6}))?")
# SR-IOV's TotalVFs is a 16-bit field: no PF has a VF index above this.
MAX_VF_INDEX = 0xFFFF


def _merged(runs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return tuple(out)


def parse_pool_entry(entry: str) -> PoolEntry:
    """Parse ``"ens1f0"``, ``"ens1f0#0-3"`` or ``"0000:af:00.0#0-3,7"``."""
    pf, sep, spec = entry.partition("#")
    if not pf:
        raise ValueError(f"{shown(entry)} names no PF")
    if not sysfs.is_pci_address(pf) and validate_ifname(pf) is not None:
        raise ValueError(f"{shown(pf)} is neither a PF netdev name nor a PCI address: it {validate_ifname(pf)}")
    if not sep:
        return PoolEntry(pf, None)
    runs: list[tuple[int, int]] = []
    for part in spec.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(f"{shown(entry)}: {shown(part)} is not a VF index or range like 0-3")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"{shown(entry)}: range {shown(part)} ends before it starts")
        if last > MAX_VF_INDEX:
            raise ValueError(f"{shown(entry)}: VF index {last} is above {MAX_VF_INDEX}, the most SR-IOV allows")
        runs.append((first, last))
    return PoolEntry(pf, _merged(runs))


def pool_vfs(sys_root: Path, entries: Iterable[PoolEntry]) -> list[sysfs.VF]:
    """Every VF the pool names, in order, each once; bad entries are config errors.

    Each PF name is resolved from sysfs once, and a repeated entry adds
    nothing: a long pfNames list costs no more sysfs reads than the PFs it
    names.  An entry whose PF this node does not have is passed over, with
    a warning, while another entry names one: one network serves a cluster
    whose node pools have different NICs.  Only when no entry's PF is here
    is the pool a config error, naming each.
    """
    out: list[sysfs.VF] = []
    seen: set[str] = set()
    done: set[PoolEntry] = set()
    resolved: dict[str, tuple[sysfs.PF, int, dict[int, str]]] = {}
    missing: dict[str, str] = {}
    for entry in entries:
        if entry in done or entry.pf in missing:
            continue
        done.add(entry)
        if entry.pf not in resolved:
            try:
                pf = sysfs.resolve_pf(sys_root, entry.pf)
                count = sysfs.numvfs(sys_root, pf.pci)
            except sysfs.SysfsError as exc:
                missing[entry.pf] = f"pfNames entry {shown(str(entry))}: {exc}"
                continue
            resolved[entry.pf] = (pf, count, sysfs.vf_pcis(sys_root, pf.pci))
        pf, count, vfs = resolved[entry.pf]
        runs = entry.runs if entry.runs is not None else ((0, count - 1),) if count else ()
        if runs and runs[-1][1] >= count:
            raise CNIError(
                Code.INVALID_CONFIG,
                f"pfNames entry {shown(str(entry))} asks for VF {runs[-1][1]}, but {entry.pf} has sriov_numvfs={count}",
            )
        for first, last in runs:
            for index in range(first, last + 1):
                pci = vfs.get(index)
                if pci is None:
                    raise CNIError(
                        Code.INVALID_CONFIG, f"{entry.pf} has no VF {index} in sysfs (virtfn{index} missing)"
                    )
                if pci not in seen:
                    seen.add(pci)
                    out.append(sysfs.VF(pci=pci, index=index, pf=pf))
    if missing and not resolved:
        raise CNIError(Code.INVALID_CONFIG, "; ".join(missing.values()))
    for why in missing.values():
        logger.warning("%s; the pool's other entries serve", why)
    return out
