"""A node as the guest's daemon tests drive it: the daemon over the test's store, the shim as ``sriov``, pods.

``sriov-cni daemon`` serves its socket with metrics on a free loopback
port and the store (``--data-dir``) under the test's directory, so that
its healing process heals that store; the static shim, linked as the
runtime's ``sriov`` and ``sriov-ipam``, forwards each call to it.  Pods are
named network namespaces, removed with the node.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from sriov_cni.daemon import install
from sriov_cni.vfstore import FileStore
from tests.support.daemonlib import Daemon
from tests.vm.plugincalls import CNI_PATH, ns_path


class ShimNode:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.state = work / "state"
        self.bin = work / "bin"
        self.bin.mkdir()
        for name in ("sriov", "sriov-ipam"):
            (self.bin / name).symlink_to(install.SHIM)
        self.daemon: Daemon | None = None
        self.url = ""
        self.namespaces: list[str] = []
        self.calls = 0

    def start(self) -> None:
        self.daemon = Daemon(
            self.work / "run", "--data-dir", str(self.state), "--metrics-address", "127.0.0.1:0", "--no-nri"
        )
        self.url = self.daemon.banner.split("metrics on ")[1].strip()

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.daemon = None

    def pod(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.namespaces.append(name)
        return name

    def start_call(
        self, command: str, conf: dict[str, Any], container: str, pod: str, args: str
    ) -> subprocess.Popen[bytes]:
        """The runtime's call: the shim on its way, its stdin already written."""
        assert self.daemon is not None
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container,
            "CNI_NETNS": ns_path(pod),
            "CNI_IFNAME": "net1",
            "CNI_PATH": CNI_PATH,
            "CNI_ARGS": args,
            "SRIOV_CNI_SOCKET": str(self.daemon.socket),
        }
        self.calls += 1
        config = self.work / f"call-{self.calls}.json"
        config.write_text(json.dumps(conf))
        with config.open("rb") as stdin:
            return subprocess.Popen(
                [str(self.bin / "sriov")], stdin=stdin, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )

    def call(self, command: str, conf: dict[str, Any], container: str, pod: str, args: str) -> dict[str, Any]:
        """The runtime's call to its end; its result (empty for DEL), which must be a success."""
        proc = self.start_call(command, conf, container, pod, args)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (command, container, stdout, stderr)
        out: dict[str, Any] = json.loads(stdout) if stdout.strip() else {}
        return out

    def records(self) -> list[str]:
        """The containers the store holds a VF for."""
        return sorted(a.container_id for a in FileStore(self.state).all()) if (self.state / "vfs").is_dir() else []

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as answer:
            return str(answer.read().decode())

    def close(self) -> None:
        self.stop()
        for name in self.namespaces:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
