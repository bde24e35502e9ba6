"""kubectl, and the kustomize built into it, as the tests run them: the
release tests/deploy/tools.txt pins, which tests/setup-host.sh installs in a
directory of its own (a machine's kubectl may be any version, or none)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

TOOLS = Path("/opt/sriov-cni-test-tools")
KUBECTL = TOOLS / "bin" / "kubectl"
REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"


def tool_path() -> str:
    """PATH with the pinned kubectl first, for commands run as a shell would."""
    return f"{KUBECTL.parent}{os.pathsep}{os.environ.get('PATH', '')}"


def kubectl(*args: str, cwd: Path = REPO) -> str:
    if not KUBECTL.exists():
        pytest.fail(f"no {KUBECTL}: run tests/setup-host.sh (it installs tests/deploy/tools.txt)")
    done = subprocess.run([str(KUBECTL), *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` makes of a kustomization, as `kubectl apply -k` would send them."""
    return [d for d in yaml.safe_load_all(kubectl("kustomize", str(directory))) if d]


def kustomizations() -> list[Path]:
    """Every kustomization a user applies: the base and each overlay (components only through overlays)."""
    return [KUBERNETES / "base", *sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())]
