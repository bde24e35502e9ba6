"""The host fixtures' node with the daemon serving metrics on loopback, for the metrics' tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemonlib import REPO, SHIM, Daemon
from tests.support.hostnode import HostNode

RULES = REPO / "deploy" / "monitoring" / "prometheus-rules.yaml"
PROMTOOL = shutil.which("promtool")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


class Rig:
    """Two PFs (three VFs; two VFs, one bound to vfio-pci) and the daemon serving metrics on loopback."""

    def __init__(self, tmp_path: Path, *options: str) -> None:
        """``options``: more of the daemon's, as the host fixtures' node takes them (``vfstats=FILE``)."""
        self.tmp = tmp_path
        self.node = HostNode(tmp_path / "node", 1, 3)
        self.node.node.add_pf(2, total=4, dpdk=(1,))
        self.pfs = self.node.node.pfs
        self.pods = [self.node.node.pod() for _ in range(3)]
        self.state = tmp_path / "state"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name in ("sriov", "sriov-ipam"):
            (self.bin / name).symlink_to(SHIM)
        # Two calls per child: children end after their calls too.
        self.daemon = Daemon(
            tmp_path / "run",
            "calls=2",
            "metrics=127.0.0.1:0",
            f"data={self.state}",
            *options,
            program=self.node.daemon_command,
        )
        self.socket, self.proc, banner = self.daemon.socket, self.daemon.proc, self.daemon.banner
        assert "metrics on http://" in banner, banner
        self.url = banner.split("metrics on ")[1].strip()
        self.address = urllib.parse.urlparse(self.url).netloc

    def conf(self, network: str = "net-a", pf: int = 0) -> bytes:
        return json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": network,
                "type": "sriov",
                "pfNames": [self.pfs[pf].name],
                "dataDir": str(self.state),
            }
        ).encode()

    def env(self, command: str, pod: int) -> dict[str, str]:
        return {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"pod{pod}",
            "CNI_NETNS": self.pods[pod],
            "CNI_IFNAME": "net1",
            "CNI_PATH": "/usr/lib/cni",
            "SRIOV_CNI_SOCKET": str(self.socket),
        }

    def call(self, command: str, pod: int, conf: bytes, program: str = "sriov") -> tuple[int, dict[str, Any]]:
        # The timeout only keeps a broken daemon from hanging the suite.
        proc = subprocess.run(
            [str(self.bin / program)], input=conf, env=self.env(command, pod), capture_output=True, timeout=120
        )
        return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {})

    def scrape(self) -> Samples:
        with urllib.request.urlopen(self.url, timeout=30) as answer:
            text = answer.read().decode()
        return {key(s.name, **s.labels): s.value for f in text_string_to_metric_families(text) for s in f.samples}

    def running(self) -> list[int]:
        return self.daemon.children()

    def close(self) -> None:
        self.daemon.stop()
        self.node.close()
