"""pyroute2's package ``__init__`` runs only when one of its own names is asked for (see sriov_cni/kernel/__init__.py).

Real: the installed pyroute2, imported in a fresh interpreter as the
executables import it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded: dict[str, object] = json.loads(out.stdout)
    return loaded


def test_the_plugin_imports_the_message_classes_without_the_rest_of_the_library() -> None:
    seen = _run(
        "import json, sys\n"
        "import sriov_cni.plugin.commands\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('pyroute2', 'asyncio')))))"
    )
    assert "pyroute2.netlink.rtnl.ifinfmsg" in seen
    for heavy in ("pyroute2.ndb.main", "pyroute2.ipdb", "pyroute2.conntrack", "asyncio"):
        assert heavy not in seen


def test_the_librarys_own_names_are_still_there_when_asked_for() -> None:
    seen = _run(
        "import json\n"
        "import sriov_cni.kernel\n"
        "import pyroute2\n"
        "from pyroute2 import IPRoute\n"
        "try:\n"
        "    pyroute2.no_such_name\n"
        "    missing = 'found'\n"
        "except AttributeError as exc:\n"
        "    missing = str(exc)\n"
        "print(json.dumps({'iproute': IPRoute.__name__, 'version': pyroute2.__version__, 'missing': missing}))"
    )
    assert seen["iproute"] == "IPRoute"
    assert seen["version"] not in ("", "unknown")
    assert seen["missing"] == "module 'pyroute2' has no attribute 'no_such_name'"
