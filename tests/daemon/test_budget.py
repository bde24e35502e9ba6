"""The daemon's memory budget as read from cgroup files, and the cap it gives.

The cgroup v2 and v1 layouts are written as files in a temporary tree (a
``/sys/fs/cgroup`` and a ``/proc/self``): this host has only one of them, and
nodes run the other.  tests/daemon/test_burst.py runs the daemon in a real
memory cgroup.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from sriov_cni import wire
from sriov_cni.cni import Code
from sriov_cni.daemon import budget
from tests.support.daemonlib import Daemon, command_line

MiB = 1 << 20
# What cgroup v1 shows for no limit (PAGE_COUNTER_MAX pages, in bytes).
V1_UNLIMITED = "9223372036854771712"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def proc_with(tmp_path: Path, cgroup: str, rss_kib: int = 40 * 1024) -> Path:
    proc = tmp_path / "proc"
    write(proc / "cgroup", cgroup)
    write(proc / "status", f"Name:\tsriov-cni\nVmHWM:\t{rss_kib + 5} kB\nVmRSS:\t{rss_kib} kB\nThreads:\t1")
    return proc


def v2_tree(tmp_path: Path, limits: dict[str, str]) -> Path:
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpuset cpu io memory pids")
    for path, limit in limits.items():
        write(root / path / "memory.max", limit)
    return root


def test_v2_limit_of_a_pod_above_an_unlimited_container(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, {"kubepods/pod1": str(256 * MiB), "kubepods/pod1/ctr": "max", "kubepods": "max"})
    proc = proc_with(tmp_path, "0::/kubepods/pod1/ctr")
    assert budget.cgroup_limit(root, proc) == (256 * MiB, root / "kubepods/pod1/memory.max")


def test_v2_the_lower_of_container_and_pod_wins(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, {"kubepods/pod1": str(256 * MiB), "kubepods/pod1/ctr": str(160 * MiB)})
    proc = proc_with(tmp_path, "0::/kubepods/pod1/ctr")
    assert budget.cgroup_limit(root, proc) == (160 * MiB, root / "kubepods/pod1/ctr/memory.max")


def test_v2_no_limit_anywhere_is_none(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, {"system.slice/sriov.service": "max"})
    proc = proc_with(tmp_path, "0::/system.slice/sriov.service")
    assert budget.cgroup_limit(root, proc) is None
    assert budget.admission(64, None, root, proc) == budget.Admission(64, None, "")


def test_v2_in_its_own_cgroup_namespace_reads_the_mount_root(tmp_path: Path) -> None:
    # A container with a cgroup namespace sees its cgroup as "/".
    root = v2_tree(tmp_path, {"": str(192 * MiB)})
    proc = proc_with(tmp_path, "0::/")
    assert budget.cgroup_limit(root, proc) == (192 * MiB, root / "memory.max")


def test_v2_a_host_path_not_mounted_falls_back_to_the_mount_root(tmp_path: Path) -> None:
    # Without a cgroup namespace, /proc/self/cgroup names the host's path
    # while only the container's own subtree is mounted.
    root = v2_tree(tmp_path, {"": str(128 * MiB)})
    proc = proc_with(tmp_path, "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope")
    assert budget.cgroup_limit(root, proc) == (128 * MiB, root / "memory.max")


def test_v1_memory_controller_limit(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "memory" / "memory.limit_in_bytes", V1_UNLIMITED)
    write(root / "memory" / "kubepods" / "memory.limit_in_bytes", V1_UNLIMITED)
    write(root / "memory" / "kubepods" / "pod1" / "memory.limit_in_bytes", str(256 * MiB))
    write(root / "memory" / "kubepods" / "pod1" / "ctr" / "memory.limit_in_bytes", V1_UNLIMITED)
    proc = proc_with(tmp_path, "12:pids:/kubepods/pod1/ctr\n4:memory:/kubepods/pod1/ctr\n0::/")
    assert budget.cgroup_limit(root, proc) == (256 * MiB, root / "memory/kubepods/pod1/memory.limit_in_bytes")


def test_v1_unlimited_is_none(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "memory" / "a" / "memory.limit_in_bytes", V1_UNLIMITED)
    write(root / "memory" / "memory.limit_in_bytes", V1_UNLIMITED)
    assert budget.cgroup_limit(root, proc_with(tmp_path, "4:memory:/a")) is None


def test_hybrid_host_reads_the_v1_memory_controller(tmp_path: Path) -> None:
    # systemd's hybrid layout: cgroup v2 mounted for tracking only, memory on v1.
    root = tmp_path / "cgroup"
    write(root / "unified" / "cgroup.controllers", "")
    write(root / "memory" / "svc" / "memory.limit_in_bytes", str(100 * MiB))
    proc = proc_with(tmp_path, "0::/svc\n4:memory:/svc")
    assert budget.cgroup_limit(root, proc) == (100 * MiB, root / "memory/svc/memory.limit_in_bytes")


def test_no_memory_hierarchy_is_none(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    assert budget.cgroup_limit(root, proc_with(tmp_path, "0::/")) is None
    assert budget.cgroup_limit(root, tmp_path / "no-proc") is None


def test_the_cap_is_what_fits_beside_the_daemon_with_headroom(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, {"": str(160 * MiB)})
    proc = proc_with(tmp_path, "0::/", rss_kib=45 * 1024)
    # The requests being read take their share first: 5 MiB of 160.
    fits = int((160 * MiB * (1 - budget.HEADROOM) - 45 * MiB - 5 * MiB) // budget.CHILD_COST)
    assert 1 < fits < 64
    found = budget.admission(64, None, root, proc)
    assert found == budget.Admission(fits, 160 * MiB, str(root / "memory.max"), 5 * MiB, 45 * MiB, 64)
    assert f"at most {fits} calls at once" in found.describe() and "160 MiB" in found.describe()
    # --max-children stays an upper bound, and a budget too small for one
    # child still serves calls one at a time.
    assert budget.admission(3, None, root, proc).children == 3
    assert budget.admission(64, 40 * MiB, root, proc) == budget.Admission(
        1, 40 * MiB, "--memory-budget", 40 * MiB // 32, 45 * MiB, 64
    )
    assert budget.Admission(1, 40 * MiB, "--memory-budget").describe().startswith("at most 1 call at once")


def test_once_children_report_what_they_hold_the_cap_follows_it(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, {"": str(160 * MiB)})
    found = budget.admission(64, None, root, proc_with(tmp_path, "0::/", rss_kib=45 * 1024))
    # 160 MiB less an eighth, the daemon's 45 and the requests' 5: 90 MiB.
    assert [found.children_at(size) for size in (3 * MiB, 6 * MiB, 9 * MiB, 200 * MiB)] == [30, 15, 10, 1]
    assert found.children_at(1 * MiB) == 64  # --max-children still bounds it
    assert budget.admission(64, None, tmp_path / "none", tmp_path / "none").children_at(100 * MiB) == 64


def test_the_requests_being_read_get_a_share_of_the_budget_and_room_for_one_of_each_size(tmp_path: Path) -> None:
    proc = proc_with(tmp_path, "0::/", rss_kib=45 * 1024)
    root = v2_tree(tmp_path, {"": "max"})
    assert budget.admission(64, None, root, proc).pending_bytes == budget.PENDING_BYTES
    assert budget.admission(64, 16 * MiB, root, proc).pending_bytes == wire.MAX_REQUEST
    assert budget.admission(64, 64 << 30, root, proc).pending_bytes == budget.PENDING_BYTES


def test_the_flag_overrides_the_cgroup(tmp_path: Path) -> None:
    root = v2_tree(tmp_path, {"": str(160 * MiB)})
    proc = proc_with(tmp_path, "0::/", rss_kib=45 * 1024)
    assert budget.admission(64, 1024 * MiB, root, proc).children == 64
    assert budget.admission(64, 1024 * MiB, root, proc).source == "--memory-budget"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("167772160", 160 * MiB),
        ("160Mi", 160 * MiB),
        ("1Gi", 1 << 30),
        ("512Ki", 512 << 10),
        ("200M", 200_000_000),
        (" 2G ", 2_000_000_000),
    ],
)
def test_sizes_as_kubernetes_writes_them(text: str, size: int) -> None:
    assert budget.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "0", "160MB", "-5Mi", "1.5Gi", "Mi", "160 Mi"])
def test_what_is_not_a_size_is_refused_by_name(text: str) -> None:
    with pytest.raises(budget.BudgetError, match="not a size"):
        budget.parse_size(text)


def test_a_bare_number_under_a_mib_is_taken_for_a_missing_unit() -> None:
    with pytest.raises(budget.BudgetError, match=r"'160' is 160 bytes, less than a MiB: give its unit \(160Mi\?\)"):
        budget.parse_size("160")


def test_the_daemon_names_its_cap_and_budget_when_it_starts(tmp_path: Path) -> None:
    with Daemon(tmp_path / "run", "--memory-budget", "100Mi") as daemon:
        banner = daemon.banner
    assert "listening on" in banner and "memory budget 100 MiB from --memory-budget" in banner, banner
    assert "3.1 MiB of requests being read" in banner, banner
    assert "at most" in banner and "at most 64 " not in banner, banner


def test_a_budget_that_is_not_a_size_is_refused_before_listening(tmp_path: Path) -> None:
    proc = subprocess.run(
        command_line(tmp_path / "run" / "plugin.sock", "--memory-budget", "1.5Gi"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--memory-budget" in proc.stderr and "not a size" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def _announce(sock: Path, size: int) -> socket.socket:
    """A caller that announces a request of ``size`` bytes, with its three descriptors, and sends no more."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    null = os.open(os.devnull, os.O_RDWR)
    try:
        fds = array.array("i", [null] * wire.DESCRIPTORS).tobytes()
        conn.sendmsg([struct.pack(wire.HEADER, size)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    finally:
        os.close(null)
    return conn


def _refused(conn: socket.socket, code: int, says: str) -> None:
    conn.settimeout(30)
    answer = conn.recv(65536)
    assert answer[:1] == bytes([wire.REFUSED]), answer
    error = json.loads(answer[1:])
    assert error["code"] == code and says in error["msg"], error


def test_a_request_past_the_budgets_share_for_requests_is_refused(tmp_path: Path) -> None:
    # 32 MiB sets aside room for one request of the largest size: while one
    # such is being read, the next is told to try again.
    with Daemon(tmp_path / "run", "--memory-budget", "32Mi") as daemon:
        sock = daemon.socket
        assert f"{wire.MAX_REQUEST / MiB:.1f} MiB of requests being read" in daemon.banner
        with _announce(sock, wire.MAX_REQUEST) as first:
            with _announce(sock, 1000) as second:
                _refused(second, Code.TRY_AGAIN, "bytes of other requests; nothing ran")
            # The first, cut short, is refused and gives its share back: a
            # request of the largest size is read again.
            first.shutdown(socket.SHUT_WR)
            _refused(first, Code.DECODE, "truncated request")
        with _announce(sock, wire.MAX_REQUEST) as third:
            third.shutdown(socket.SHUT_WR)
            _refused(third, Code.DECODE, "truncated request")
