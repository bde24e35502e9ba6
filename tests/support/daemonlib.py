"""What the daemon's tests share: a real daemon process, the shim run as a CNI executable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sriov_cni.daemon import install, nri
from tests.support import daemonprocs

REPO = Path(__file__).resolve().parents[2]
SHIM = Path(install.SHIM)

T = TypeVar("T")


def command_line(socket: Path | str, *options: str, command: str = "daemon") -> list[str]:
    """``sriov-cni COMMAND --socket SOCKET OPTIONS``, run by this interpreter from the package on its path."""
    return [sys.executable, "-c", "from sriov_cni.cli import main; main()", command, "--socket", str(socket), *options]


class Daemon:
    """A daemon serving ``directory``/plugin.sock: started, its banner read and checked; stop() ends it.

    The one way the tests, benchmarks and the guest's tests start a daemon.
    ``program`` makes its command line from the socket and ``options``:
    :func:`command_line` by default, ``HostNode.daemon_command`` for the
    host fixtures' node; ``wrapper`` goes before it (a memory cgroup's, a
    tracer's).  Its stderr stays a pipe after the banner, for the tests that
    read what it says later.
    """

    def __init__(
        self,
        directory: Path,
        *options: str,
        program: Callable[..., list[str]] | None = None,
        env: Mapping[str, str] | None = None,
        wrapper: Sequence[str] = (),
        cwd: Path = REPO,
    ) -> None:
        self.socket = directory / "plugin.sock"
        argv = program(str(self.socket), *options) if program else command_line(self.socket, *options)
        self.proc = subprocess.Popen(
            [*wrapper, *argv], cwd=cwd, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {}))
        )
        assert self.proc.stderr is not None
        self.banner = self.proc.stderr.readline()
        if f"listening on {self.socket}" not in self.banner:
            self.stop()
            raise AssertionError(f"the daemon did not start on {self.socket}: {self.banner!r}")

    def __enter__(self) -> Daemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def all_children(self) -> list[int]:
        return daemonprocs.all_children(self.proc.pid)

    def children(self) -> list[int]:
        """The children running a call (waiting ones not)."""
        return daemonprocs.running_calls(self.proc.pid)

    def stop(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen[str]) -> None:
    """End a daemon started with its stderr piped, unless it ended already."""
    if proc.poll() is None:
        proc.terminate()
    # Long enough for a guest under TCG to end the daemon's children.
    proc.wait(timeout=60)
    assert proc.stderr is not None
    proc.stderr.close()


def exporter_of(daemon: int) -> int:
    """The daemon's metrics exporter: in its process group, with its command line, not its child, nor its NRI plugin."""
    cmdline = Path(f"/proc/{daemon}/cmdline").read_bytes()
    children = set(Path(f"/proc/{daemon}/task/{daemon}/children").read_text().split())
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != daemon and entry.name not in children:
            try:
                if (entry / "comm").read_text().strip() == nri.PROCESS_NAME:
                    continue
                if (entry / "cmdline").read_bytes() == cmdline and daemonprocs.group_of(
                    int(entry.name)
                ) == daemonprocs.group_of(daemon):
                    return int(entry.name)
            except OSError:
                continue
    raise LookupError("no exporter process found")


def broken_children(tmp_path: Path) -> list[str]:
    """A wrapper for Daemon under which every child fails as it starts.

    Each child opens /dev/null first; here it is a read-only file in the
    daemon's mount namespace.
    """
    null = tmp_path / "null"
    null.write_bytes(b"")
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind -o ro "$0" /dev/null && exec "$@"',
        str(null),
    ]


def shim(
    socket_path: Path,
    command: str,
    stdin: bytes = b"",
    exe: Path = SHIM,
    name: str = "sriov",
    env: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Run the shim as ``name`` (a symlink, as install-cni's copies are named)."""
    link = socket_path.parent.parent / "bin" / name
    link.parent.mkdir(exist_ok=True)
    if not (link.is_symlink() and os.readlink(link) == str(exe)):
        # Renamed into place: callers in several threads share the link.
        tmp = link.with_name(f".{name}.{uuid.uuid4().hex}")
        tmp.symlink_to(exe)
        os.replace(tmp, link)
    call_env = {"CNI_COMMAND": command, "SRIOV_CNI_SOCKET": str(socket_path), "PATH": "/usr/bin:/bin", **(env or {})}
    # The timeout only keeps a broken shim from hanging the suite.
    proc = subprocess.run([str(link)], input=stdin, env=call_env, capture_output=True, timeout=60)
    out = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, out


def ipam_conf(tmp_path: Path) -> bytes:
    net = f"shim-{uuid.uuid4().hex[:8]}"
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": net,
            "type": "sriov",
            "ipam": {"type": "sriov-ipam", "subnet": "10.77.0.0/24", "dataDir": str(tmp_path / "ipam")},
        }
    ).encode()


def ipam_env(container: str) -> dict[str, str]:
    return {
        "CNI_CONTAINERID": container,
        "CNI_NETNS": "/proc/1/ns/net",
        "CNI_IFNAME": "net1",
        "CNI_PATH": "/opt/cni/bin",
    }


def wait_for(probe: Callable[[], T]) -> T:
    """``probe()`` once it is true (polled: these are other processes' states)."""
    for _ in range(1200):
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition never held: {probe.__qualname__} last gave {value!r}")
