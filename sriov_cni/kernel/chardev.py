"""Character devices' numbers as sysfs gives them (``<class>/<name>/dev``), for a device made elsewhere (a container).

Read from sysfs, not from ``/dev``: the daemon's container need not have
the node's ``/dev/infiniband``, and the numbers are the kernel's.
"""

from __future__ import annotations

from pathlib import Path


def numbers(sys_root: Path, device_class: str, name: str) -> tuple[int, int] | None:
    """The major and minor number of ``name`` in ``device_class`` (``infiniband_verbs``, ``misc``); None when absent."""
    try:
        major, _, minor = (sys_root / "class" / device_class / name / "dev").read_text().strip().partition(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        return None
