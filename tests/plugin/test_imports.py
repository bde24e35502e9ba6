"""Which modules load pyroute2: only the ones that speak netlink.

Parsing a config, choosing a VF and the tuning hook's checks run on every
CNI call, some before any netlink request (or without one, for a refused
config); loading pyroute2 for them is paid for nothing.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sriov_cni

PACKAGE = Path(sriov_cni.__file__).parent
NETLINK_SPEAKERS = {"kernel.links", "kernel.rtnl", "kernel.vfcontrol"}


def test_only_the_netlink_modules_import_pyroute2() -> None:
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "pyroute2" for n in names):
                importers.add(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    assert importers == NETLINK_SPEAKERS


def test_config_allocation_store_and_tuning_do_not_load_pyroute2() -> None:
    code = (
        "import sys\n"
        "import sriov_cni.plugin.allocate, sriov_cni.plugin.config, sriov_cni.plugin.pool, sriov_cni.plugin.tuning\n"
        "import sriov_cni.vfstate, sriov_cni.vfstore\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyroute2'))\n"
        "import sriov_cni.kernel.netlink\n"
        "print('pyroute2' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split("\n")[:2] == ["[]", "True"], proc.stdout
