"""Where on the node the code finds what lies outside its data directories, in one value.

The entry points (the ``sriov`` plugin's :func:`~sriov_cni.plugin.commands.run`,
``sriov-cni setup``) build one :class:`Paths` and pass it down, as host-local
passes its data directory; a test builds one over a temporary tree.
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
