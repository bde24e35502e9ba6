"""Where on the node the code finds what lies outside its data directories, in one value.

The entry points (the ``sriov`` plugin's :func:`~sriov_cni.plugin.commands.run`,
the ``sriov-cni`` commands, the daemon's children) build one :class:`Paths`
and pass it down, as host-local passes its data directory; the kernel layer
takes the roots it needs as plain arguments.  A test builds one over a
temporary tree that describes PFs, VFs and their IRQs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sriov_cni import nodestate


@dataclass(frozen=True)
class Paths:
    # What setup applied, for the plugin's tuning hook (see nodestate).
    state_file: Path = nodestate.STATE_FILE
    # Where systemd keeps its runtime state; present only when it is PID 1.
    systemd_run: Path = Path("/run/systemd/system")
    # sysfs and procfs as the host mounted them.
    sys: Path = Path("/sys")
    proc: Path = Path("/proc")
    # The host's /proc/irq: elsewhere in a container that is not privileged,
    # whose runtime makes /proc/irq read-only (``sriov-cni daemon --proc-irq``).
    proc_irq: Path = Path("/proc/irq")
    # Where setup writes the ib_core option for the node's RDMA netns mode.
    modprobe_dir: Path = Path("/etc/modprobe.d")
