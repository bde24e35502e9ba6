"""kubectl, and the kustomize built into it, as the tests run them: the
release tests/deploy/tools.txt pins, which tests/setup-host.sh installs in a
directory of its own (a machine's kubectl may be any version, or none)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sriov_cni.cni import CmdArgs
from sriov_cni.plugin import config as plugin_config

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


def nad_notes(doc: dict[str, Any]) -> tuple[tuple[int, str], ...]:
    """What the plugin's config parser notes of a NetworkAttachmentDefinition's config, given as an ADD: raises on
    what it refuses; a note is a key ignored for another or read under another name."""
    conf = json.loads(doc["spec"]["config"])
    if "k8s.v1.cni.cncf.io/resourceName" in doc["metadata"].get("annotations", {}):
        # Multus passes the device plugin's VF as runtimeConfig.deviceID.
        conf["runtimeConfig"] = {"deviceID": "0000:03:10.0"}
    cmd = CmdArgs(
        command="ADD",
        container_id="c",
        netns="/var/run/netns/pod",
        ifname="net1",
        args={},
        path=(),
        stdin=json.dumps(conf).encode(),
        conf=conf,
        cni_version=conf["cniVersion"],
        env={},
    )
    return plugin_config.load(cmd).notes
