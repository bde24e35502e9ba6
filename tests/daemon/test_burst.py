"""A burst of ADDs against the daemon in a small memory cgroup, and the OOM killer's choice.

The node is the host fixtures (veth ends as VFs in a temporary sysfs, the PF
side faked in the daemon: tests/support/hostnode.py), the calls go through the
static shim, and the daemon runs in a memory cgroup of its own
(tests/support/memcg.py), so that it, its children and the IPAM plugins they run
are charged there as in the DaemonSet's pod.  Not timed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.daemon import budget, install
from tests.support.daemonlib import Daemon
from tests.support.hostnode import HostNode
from tests.support.memcg import MemoryCgroup
from tests.support.pluginlib import DEBIAN_CNI_DIR, link

MiB = 1 << 20
SHIM = Path(install.SHIM)
BURST = 64
CAP_SYS_RESOURCE = 24


class Rig:
    """A node of ``vfs`` VFs, pods for them, and the daemon in a cgroup limited to ``limit``."""

    def __init__(self, tmp_path: Path, vfs: int, limit: int) -> None:
        self.tmp = tmp_path
        self.node = HostNode(tmp_path / "node", 1, vfs)
        self.pods = [self.node.node.pod() for _ in range(vfs)]
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        (self.bin / "sriov").symlink_to(SHIM)
        self.cgroup = MemoryCgroup(limit)
        self.daemon = Daemon(tmp_path / "run", program=self.node.daemon_command, wrapper=self.cgroup.wrap([]))

    def conf(self, ipam_type: str = "host-local") -> bytes:
        return json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "burst",
                "type": "sriov",
                "pfNames": [pf.name for pf in self.node.node.pfs],
                "dataDir": str(self.tmp / "state"),
                "ipam": {"type": ipam_type, "subnet": "10.95.0.0/24", "dataDir": str(self.tmp / "ipam")},
            }
        ).encode()

    def start(self, command: str, i: int, conf: bytes, cni_path: str = DEBIAN_CNI_DIR) -> subprocess.Popen[bytes]:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"burst{i}",
            "CNI_NETNS": self.pods[i],
            "CNI_IFNAME": "net1",
            "CNI_PATH": cni_path,
            "SRIOV_CNI_SOCKET": str(self.daemon.socket),
        }
        proc = subprocess.Popen(
            [str(self.bin / "sriov")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert proc.stdin is not None
        proc.stdin.write(conf)
        proc.stdin.close()
        proc.stdin = None
        return proc

    def call(self, command: str, i: int, conf: bytes, cni_path: str = DEBIAN_CNI_DIR) -> tuple[int, dict[str, Any]]:
        return answer(self.start(command, i, conf, cni_path))

    def host_vfs(self) -> dict[str, dict[str, Any] | None]:
        """Each VF netdev as ``ip -j`` sees it in the host (None: not there)."""
        return {vf.netdev: link(vf.netdev) for pf in self.node.node.pfs for vf in pf.vfs if vf.netdev}

    def records(self) -> list[str]:
        vfs = self.tmp / "state" / "vfs"
        return sorted(p.name for p in vfs.iterdir()) if vfs.is_dir() else []

    def close(self) -> None:
        self.daemon.stop()
        self.cgroup.remove()
        self.node.close()


def answer(proc: subprocess.Popen[bytes]) -> tuple[int, dict[str, Any]]:
    # The timeout only keeps a broken daemon from hanging the suite.
    out, err = proc.communicate(timeout=120)
    return proc.returncode, (json.loads(out) if out.strip() else {"stderr": err.decode()})


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Rig]:
    # Room for the daemon and a few children, far from one per call: 64
    # children of the daemon take about 400 MiB (tests/bench/bench_burst.py).
    rig = Rig(tmp_path, BURST, 112 * MiB)
    yield rig
    rig.close()


def test_a_burst_of_64_adds_in_a_small_cgroup_all_succeed_and_the_daemon_lives(small: Rig) -> None:
    assert "at most" in small.daemon.banner and f"at most {BURST} " not in small.daemon.banner, small.daemon.banner
    before = small.host_vfs()
    conf = small.conf()
    adds = [answer(p) for p in [small.start("ADD", i, conf) for i in range(BURST)]]
    assert [rc for rc, _ in adds] == [0] * BURST, [out for rc, out in adds if rc][:3]
    # Every pod holds its own VF, as the kernel sees it.
    in_pods = [link("net1", Path(pod).name) for pod in small.pods]
    assert all(in_pods) and len({entry["address"] for entry in in_pods if entry}) == BURST
    assert len({out["ips"][0]["address"] for _, out in adds}) == BURST
    dels = [answer(p) for p in [small.start("DEL", i, conf) for i in range(BURST)]]
    assert [rc for rc, _ in dels] == [0] * BURST, [out for rc, out in dels if rc][:3]
    assert small.cgroup.oom_kills() == 0
    assert small.daemon.proc.poll() is None, "the daemon died"
    assert small.host_vfs() == before and small.records() == []
    # The cap followed what the children said they held, and that many of
    # them fit in the limit.
    assert small.daemon.proc.stderr is not None
    said = next(line for line in small.daemon.proc.stderr if "a call's child holds" in line)
    found = re.search(r"holds ([0-9.]+) MiB: at most (\d+) calls? at once", said)
    assert found, said
    held, cap = float(found[1]) * MiB, int(found[2])
    assert 1 * MiB < held < 32 * MiB and 1 <= cap < BURST and cap * held < 112 * MiB, said


def may_lower_oom_score_adj() -> bool:
    """Whether this process has CAP_SYS_RESOURCE (a container may have root without it)."""
    [caps] = [
        line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff:")
    ]
    return bool(int(caps, 16) >> CAP_SYS_RESOURCE & 1)


def test_the_daemon_is_exempt_from_the_oom_killer_and_its_children_go_first(small: Rig) -> None:
    daemon_adj = int(Path(f"/proc/{small.daemon.proc.pid}/oom_score_adj").read_text())
    if may_lower_oom_score_adj():
        assert daemon_adj == budget.DAEMON_OOM_SCORE_ADJ
    else:
        # The daemon says so and keeps the value it was started with.
        assert small.daemon.proc.stderr is not None
        warning = small.daemon.proc.stderr.readline()
        assert "cannot exempt the daemon from the OOM killer" in warning and "CAP_SYS_RESOURCE" in warning, warning
        assert daemon_adj == int(Path("/proc/self/oom_score_adj").read_text())
    children_file = Path(f"/proc/{small.daemon.proc.pid}/task/{small.daemon.proc.pid}/children")

    def adjusted() -> list[str]:
        """The spares' oom_score_adj, once the daemon has forked them and they have set it."""
        values = [
            Path(f"/proc/{child}/oom_score_adj").read_text().strip() for child in children_file.read_text().split()
        ]
        return values if values and set(values) == {str(budget.CHILD_OOM_SCORE_ADJ)} else []

    deadline = time.monotonic() + 30
    while not adjusted() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert adjusted(), [Path(f"/proc/{c}/oom_score_adj").read_text() for c in children_file.read_text().split()]


def test_a_call_killed_by_the_oom_killer_fails_clearly_and_leaves_nothing(tmp_path: Path) -> None:
    # A delegated IPAM plugin whose ADD grows until the cgroup's limit
    # stops it (its DEL has nothing to release).  It stays smaller than the
    # daemon, whose resident size counts every page it shares with its
    # children: with equal OOM preferences the kernel takes the daemon.
    hog_dir = tmp_path / "hog-bin"
    hog_dir.mkdir()
    hog = hog_dir / "hog-ipam"
    hog.write_text(
        f"#!{sys.executable}\nimport os\nheld = []\nwhile os.environ['CNI_COMMAND'] == 'ADD':\n"
        "    held.append(b'x' * (1 << 20))\n"
    )
    hog.chmod(0o755)
    rig = Rig(tmp_path, 2, 80 * MiB)
    try:
        before = rig.host_vfs()
        rc, out = rig.call("ADD", 0, rig.conf("hog-ipam"), str(hog_dir))
        assert rig.cgroup.oom_kills() >= 1
        # The kernel took the IPAM plugin (code 102) or the call's child (11).
        assert rc != 0 and out.get("code") in (11, 102) and out.get("msg"), out
        # Whatever the kernel took (the IPAM plugin, or the call's child),
        # the answer says so and the runtime's DEL finds nothing to undo
        # that it cannot.
        rc, out = rig.call("DEL", 0, rig.conf("hog-ipam"), str(hog_dir))
        assert rc == 0, out
        assert rig.daemon.proc.poll() is None, "the OOM killer took the daemon"
        assert rig.host_vfs() == before and rig.records() == []
        # And the daemon serves the next pod.
        rc, out = rig.call("ADD", 1, rig.conf())
        assert rc == 0, out
        rc, out = rig.call("DEL", 1, rig.conf())
        assert rc == 0, out
    finally:
        rig.close()


def test_calls_past_the_cap_wait_their_turn_even_hundreds_of_them(tmp_path: Path) -> None:
    # One call at a time and hundreds at once: every caller past the cap
    # waits, read by the daemon or in the listen queue, and none is refused
    # (a shim whose connect is not accepted within 5 s gives up).
    daemon = Daemon(tmp_path / "run", "--max-children", "1")
    link_ = tmp_path / "sriov"
    link_.symlink_to(SHIM)
    env = {"CNI_COMMAND": "VERSION", "SRIOV_CNI_SOCKET": str(daemon.socket), "PATH": "/usr/bin:/bin"}
    waiting = 300
    try:
        assert "at most 1 call at once" in daemon.banner
        version = tmp_path / "version.json"
        version.write_text('{"cniVersion": "1.0.0"}')
        callers = []
        for _ in range(waiting):
            with version.open("rb") as stdin:
                callers.append(subprocess.Popen([str(link_)], stdin=stdin, stdout=subprocess.PIPE, env=env))
        answers = [(p.returncode, out) for p in callers for out, _ in [p.communicate(timeout=120)]]
        assert [rc for rc, _ in answers] == [0] * waiting, [out for rc, out in answers if rc][:3]
        assert all(b"supportedVersions" in out for _, out in answers)
    finally:
        daemon.stop()
