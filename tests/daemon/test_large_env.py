"""A call whose environment is large but within the daemon's limit is run with all of it.

Real: the daemon in its own process, the shim as the executable, and for
``sriov`` an IPAM plugin executed from CNI_PATH (a fixture: a script that
writes down the environment it was given).  How the time of such a call
grows with its environment is measured by tests/bench/bench_inputs.py.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from sriov_cni import __version__, wire
from sriov_cni.daemon import child, intake
from tests.support.daemonlib import Daemon, ipam_conf, ipam_env, shim

# 100 000 entries of 4 to 9 bytes: 889 KB, under wire.MAX_REQUEST.
ENTRIES = 100_000
PADDING = {f"E{i}": "x" for i in range(ENTRIES)}

# The environment as execve gave it (/proc/self/environ): os.environ has
# what Python's startup added too (LC_CTYPE, by its locale coercion).
ENV_WRITER = """#!{python}
import os, shutil, sys
sys.stdin.read()
shutil.copyfile("/proc/self/environ", os.environ["ENV_SEEN"])
"""


def test_sriov_ipam_serves_a_call_with_a_large_environment(daemon: Daemon, tmp_path: Path) -> None:
    conf = ipam_conf(tmp_path)
    env = {**ipam_env("large"), **PADDING}
    rc, out = shim(daemon.socket, "ADD", conf, name="sriov-ipam", env=env)
    assert rc == 0, out
    leases = [p.name for p in (tmp_path / "ipam").rglob("10.77.0.*")]
    assert leases == [out["ips"][0]["address"].split("/")[0]]
    rc, out = shim(daemon.socket, "DEL", conf, name="sriov-ipam", env=env)
    assert (rc, out) == (0, {})
    assert not list((tmp_path / "ipam").rglob("10.77.0.*"))


def test_the_delegated_ipam_plugin_gets_the_callers_whole_environment(daemon: Daemon, tmp_path: Path) -> None:
    bindir = tmp_path / "cni-bin"
    bindir.mkdir()
    plugin = bindir / "env-writer"
    plugin.write_text(ENV_WRITER.format(python=sys.executable))
    plugin.chmod(0o755)
    seen = tmp_path / "seen.json"
    conf = json.dumps(
        {
            "cniVersion": "1.1.0",
            "name": "large-env",
            "type": "sriov",
            "dataDir": str(tmp_path / "state"),
            "ipam": {"type": "env-writer"},
        }
    ).encode()
    env = {"CNI_PATH": str(bindir), "ENV_SEEN": str(seen), **PADDING}
    # GC runs the IPAM plugin without needing a VF.
    rc, out = shim(daemon.socket, "GC", conf, env=env)
    assert (rc, out) == (0, {})
    got = dict(entry.partition("=")[::2] for entry in seen.read_text().split("\0") if entry)
    # The caller's environment, each entry as given, CNI_COMMAND among them;
    # nothing of the daemon's own.
    assert got.pop("SRIOV_CNI_SOCKET") == str(daemon.socket)
    assert got == {"CNI_COMMAND": "GC", "PATH": "/usr/bin:/bin", **env}


def test_a_child_takes_the_environment_over_without_setting_it_in_its_own() -> None:
    # The C library sets (and unsets) one variable at a time, each after a
    # search of the whole environment: copied in, a caller's 100 000 entries
    # cost some 10^10 comparisons.  So the child's own environment must stay
    # as it was.  In a forked process: taking a call over replaces its
    # stdin, stdout and stderr.
    env = {"CNI_COMMAND": "VERSION", **PADDING}
    body = wire.encode_request(__version__, "sriov-ipam", "/", env)[wire.HEADER_SIZE :]
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            conn, _ = socket.socketpair()
            fds = [os.open("/dev/null", os.O_RDWR) for _ in range(3)]
            before = dict(os.environ)
            program, _, taken = child._become_caller(intake.Call(conn, fds, body), child.Report())
            status = 0 if (program, taken, dict(os.environ)) == ("sriov-ipam", env, before) else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
