"""The node state file: what ``sriov-cni setup`` applied, for the plugin and ``status``.

Setup decides a :class:`Policy` per PF and writes it, with the IRQ pins it
made, to :data:`STATE_FILE`; the plugin's per-VF hook
(:mod:`sriov_cni.plugin.tuning`) reads it on every ADD and DEL.  The file is
replaced atomically and carries :data:`STATE_VERSION`, so a plugin never
acts on half a file or on a layout it does not know.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sriov_cni import safepath

STATE_FILE = Path("/run/sriov-cni/node.json")
STATE_VERSION = 1


class TuningError(Exception):
    """A tuning policy cannot be decided, read or applied."""


@dataclass(frozen=True)
class Policy:
    """What setup decided for one PF and its VFs; CPU lists are already resolved."""

    irq_cpus: list[int]
    rps_cpus: list[int]  # empty: RPS off
    rfs_flow_entries: int  # 0: RFS off
    xps: bool

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Policy:
        return cls(
            irq_cpus=[int(c) for c in raw["irq_cpus"]],
            rps_cpus=[int(c) for c in raw["rps_cpus"]],
            rfs_flow_entries=int(raw["rfs_flow_entries"]),
            xps=bool(raw["xps"]),
        )


def replace_file(path: Path, text: str, mode: int) -> None:
    """Replace a file atomically, so that its readers never see half of it."""
    # Readers trust these files (the plugin pins IRQs from the state file,
    # irqbalance runs the policy script as root): written only into a
    # directory no one else can write.
    safepath.state_dir(os.path.abspath(path.parent), 0o755, "state file directory")
    safepath.replace_file(path, text.encode(), mode)


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file atomically, so the plugin never reads half of it."""
    replace_file(path, json.dumps({"version": STATE_VERSION, **state}, indent=1, sort_keys=True), 0o644)


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TuningError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise TuningError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("version") != STATE_VERSION:
        raise TuningError(f"{path} is not a version {STATE_VERSION} node state file; run sriov-cni setup again")
    return raw


def pf_policy(state: dict[str, Any], pf_pci: str) -> Policy | None:
    raw = state.get("pfs", {}).get(pf_pci, {}).get("tuning")
    return Policy.from_json(raw) if raw else None


def policy_json(policy: Policy) -> dict[str, Any]:
    return asdict(policy)
