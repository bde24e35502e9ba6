"""A delegated IPAM plugin that hangs, for the tests of what a killed call leaves running.

Shared by the plugin and daemon tests.
"""

from __future__ import annotations

import time
from pathlib import Path


def install(bin_dir: Path, pid_file: Path) -> str:
    """Write ``hang-ipam`` into ``bin_dir``: it records its pid in ``pid_file``, then sleeps.

    Returns the IPAM type to name in a config.  The pid file appears whole
    (written aside, then renamed), so a reader never sees a partial number.
    """
    hang = bin_dir / "hang-ipam"
    hang.write_text(f"#!/bin/sh\necho $$ > {pid_file}.tmp\nmv {pid_file}.tmp {pid_file}\nexec sleep 300\n")
    hang.chmod(0o755)
    return hang.name


def started(pid_file: Path) -> int:
    """The pid ``hang-ipam`` recorded, once it has started.

    Bounded for a plugin that never starts: its start passes through a
    daemon or plugin process and a new interpreter, which a loaded machine
    can stretch to many seconds.
    """
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"hang-ipam never started ({pid_file} missing)")
        time.sleep(0.05)
    return int(pid_file.read_text())


def ended(pid: int) -> bool:
    """No such process, or a zombie its parent has not collected yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
