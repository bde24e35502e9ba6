"""One ADD reads each of its VF's sysfs files once: work counted by strace, not time.

ADD describes the VF once (PCI address, PF, index, driver, host netdev),
from the pool's pick or from the deviceID a device plugin passed, and hands
that description to every later step; before, five steps read the VF's
driver and netdev again.  The ADD runs in a child process of its own under
strace, as this module run as a program, and every system call that names a
path in the node's sysfs tree is counted.

Real: the plugin's ADD (``commands.run``), the veth "VF" netdevs, the pod's
network namespace, the system calls strace reports.  Fixture: the sysfs
tree describing the PF and its VFs, and the PF side of SR-IOV
(``FakeVfControl``, in the child's memory).
"""

from __future__ import annotations

import collections
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sriov_cni.paths import Paths
from sriov_cni.plugin import commands
from sriov_cni.vfstore import FileStore
from tests.support.fakes import FakeVfControl
from tests.support.pluginlib import REPO, Node

# The first path argument of a traced call: openat(AT_FDCWD, "/...", ...),
# readlink("/...", ...), newfstatat(AT_FDCWD, "/...", ...).
_PATH_CALL = re.compile(r'^\d+ +(\w+)\((?:AT_FDCWD, )?"([^"]+)"')


def traced_add(node: Node, pf_name: str, vfs: int, conf: dict[str, object], netns: str) -> collections.Counter[str]:
    """One ADD in a child under strace; how many calls named each path under ``node.sys`` (relative to it)."""
    if shutil.which("strace") is None:
        pytest.fail("strace is missing: tests/setup-host.sh installs it")
    trace = node.sys.parent / "add.trace"
    child = [sys.executable, "-m", "tests.plugin.test_sysfs_reads", str(node.sys), f"{pf_name}:{vfs}"]
    stdin = json.dumps({"env": node.env("ADD", netns=netns), "conf": conf})
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(trace), *child],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["interfaces"][0]["name"] == "net1", done.stdout
    root = f"{node.sys}/"
    counts: collections.Counter[str] = collections.Counter()
    for line in trace.read_text().splitlines():
        m = _PATH_CALL.match(line)
        if m and m.group(2).startswith(root):
            counts[m.group(2)[len(root) :]] += 1
    return counts


def assert_read_once(counts: collections.Counter[str], vf_pci: str, pf_pci: str) -> None:
    vf_dir = f"bus/pci/devices/{vf_pci}"
    ours = {path: n for path, n in counts.items() if path.startswith(vf_dir)}
    # The reads that describe the VF happened (the count cannot pass by
    # tracing nothing), each once.
    assert ours.get(f"{vf_dir}/driver") == 1, counts
    assert ours.get(f"{vf_dir}/net") == 1, counts
    assert all(n == 1 for n in ours.values()), ours
    virtfns = {path: n for path, n in counts.items() if path.startswith(f"bus/pci/devices/{pf_pci}/virtfn")}
    assert virtfns and all(n == 1 for n in virtfns.values()), virtfns


def test_a_pool_add_reads_its_vf_once(node: Node) -> None:
    pf = node.add_pf(7)
    pod = node.pod()
    counts = traced_add(node, pf.name, len(pf.vfs), node.conf(pfNames=[pf.name]), pod)
    assert_read_once(counts, pf.vfs[0].pci, pf.pci)


def test_a_device_plugins_vf_is_read_once(node: Node) -> None:
    pf = node.add_pf(7)
    pod = node.pod()
    vf = pf.vfs[3]
    counts = traced_add(node, pf.name, len(pf.vfs), node.conf(deviceID=vf.pci), pod)
    assert_read_once(counts, vf.pci, pf.pci)
    # Only the named VF is looked at.
    assert not [path for path in counts if any(other.pci in path for other in pf.vfs if other is not vf)], counts


def _add(sys_root: str, pf: str) -> int:
    """The child: ADD with the PF side in memory; the call's env and config come as JSON on stdin."""
    name, count = pf.rsplit(":", 1)
    fake = FakeVfControl()
    fake.add_pf(name, int(count))
    given = json.load(sys.stdin)
    deps = commands.Deps(vf_control=lambda: fake, store=FileStore, paths=Paths(sys=Path(sys_root)))
    out, err = io.StringIO(), io.StringIO()
    rc = commands.run(given["env"], json.dumps(given["conf"]).encode(), out, err, deps)
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    return rc


if __name__ == "__main__":
    sys.exit(_add(sys.argv[1], sys.argv[2]))
