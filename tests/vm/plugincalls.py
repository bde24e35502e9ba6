"""The ``sriov`` plugin called in process in the igb guest, and what its driver tests read back.

Shared by the plugin's guest tests (test_plugin_igb.py and the MAC, reuse,
DPDK and shim tests): a call with the plugin's real dependencies, the PF's
view of a VF and a link's as ``ip -j`` shows them, the store's records.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

from sriov_cni.plugin import commands
from tests.vm.vmlib import ip_json

CNI_PATH = "/usr/lib/cni"


def vfinfo(pf: str, vf: int) -> dict[str, Any]:
    [link] = ip_json("-d", "link", "show", "dev", pf)
    [info] = [i for i in link["vfinfo_list"] if i["vf"] == vf]
    return dict(info)


def restored(after: dict[str, Any], before: dict[str, Any]) -> None:
    """The PF's view of a VF is exactly as before ADD, the MAC it reports included."""
    assert after == before


def host_link(name: str, netns: str | None = None) -> dict[str, Any] | None:
    cmd = ["ip", "-j"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    [entry] = json.loads(proc.stdout)
    return dict(entry)


def view(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {"ifname": entry["ifname"], "address": entry["address"], "mtu": entry["mtu"], "up": "UP" in entry["flags"]}


def records(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "vfs").glob("*.json")) if (data_dir / "vfs").is_dir() else []


def env(command: str, container: str = "c1", netns: str = "", ifname: str = "net1") -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_PATH": CNI_PATH,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


def cni(command: str, conf: dict[str, Any], **kw: str) -> tuple[int, Any]:
    """The plugin in-process with its real dependencies; returns (exit status, parsed stdout)."""
    out, err = io.StringIO(), io.StringIO()
    rc = commands.run(env(command, **kw), json.dumps(conf).encode(), out, err)
    text = out.getvalue()
    return rc, (json.loads(text) if text.strip() else None)


def ns_path(name: str) -> str:
    return f"/var/run/netns/{name}"


class Pod(NamedTuple):
    mac: str | None
    trust: str | None


def conf(data_dir: Path, pf: str, vlan: int | None, pod: Pod) -> dict[str, Any]:
    ipam = {"type": "sriov-ipam", "dataDir": str(data_dir / "ipam"), "ranges": [[{"subnet": "10.82.0.0/24"}]]}
    keys: dict[str, Any] = {}
    if vlan is not None:
        keys["vlan"] = vlan
    if pod.mac is not None:
        keys["mac"] = pod.mac
    if pod.trust is not None:
        keys["trust"] = pod.trust
    return {
        "cniVersion": "1.0.0",
        "name": "reusenet",
        "type": "sriov",
        "pfNames": [pf],
        "dataDir": str(data_dir),
        "ipam": ipam,
        **keys,
    }


def ping(pod: str, address: str) -> None:
    out = subprocess.run(
        ["ip", "netns", "exec", pod, "ping", "-c", "2", "-i", "0.2", "-W", "5", address], capture_output=True, text=True
    )
    assert out.returncode == 0, f"{pod} -> {address}: {out.stdout}{out.stderr}"
