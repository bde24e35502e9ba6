"""A memory cgroup of its own for a daemon under test: its limit, its peak, its OOM kills, its CPU time.

Made below the cgroup this process is in (cgroup v1's memory controller or
cgroup v2), so that it needs no knowledge of the machine's layout.  Shared
by the daemon tests and the burst benchmark.  On cgroup v1 the CPU time is
counted by the cpuacct controller, in a cgroup of the same name there.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from sriov_cni.daemon import budget


class MemoryCgroup:
    """A child memory cgroup limited to ``limit`` bytes (None: no limit)."""

    def __init__(self, limit: int | None, name: str = "sriov-cni-test") -> None:
        parent = budget.memory_cgroup()
        if parent is None:
            raise RuntimeError("this process is in no memory cgroup: /proc/self/cgroup names no memory hierarchy")
        self.v2 = parent.v2
        self.path = parent.path / f"{name}-{uuid.uuid4().hex[:6]}"
        self.path.mkdir()
        if limit is not None:
            (self.path / parent.limit_file).write_text(str(limit))
        # Without swap, as a pod is: a cgroup at its limit reclaims, then
        # kills, rather than swapping for minutes (the file is absent when
        # the kernel accounts no swap).
        no_swap = self.path / ("memory.swap.max" if self.v2 else "memory.swappiness")
        if no_swap.exists():
            no_swap.write_text("0")
        self.cpuacct: Path | None = None
        if not self.v2:
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                if "cpuacct" in controllers.split(","):
                    mount = parent.mount.parent / ",".join(sorted(controllers.split(",")))
                    self.cpuacct = mount / path.lstrip("/") / self.path.name
                    self.cpuacct.mkdir()

    def wrap(self, command: list[str]) -> list[str]:
        """``command``, started inside the cgroup (before it forks anything)."""
        joins = " && ".join(f"echo $$ > {cgroup / 'cgroup.procs'}" for cgroup in (self.path, self.cpuacct) if cgroup)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *command]

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def peak(self) -> int:
        """The most bytes charged to the cgroup since it was made."""
        return int(self._read("memory.peak" if self.v2 else "memory.max_usage_in_bytes"))

    def oom_kills(self) -> int:
        """Processes of the cgroup the OOM killer has killed."""
        text = self._read("memory.events" if self.v2 else "memory.oom_control")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise LookupError(f"no oom_kill count in {self.path} (a kernel older than 4.13?)")

    def cpu_seconds(self) -> float:
        """CPU time the cgroup's processes used, user and system, since it was made."""
        if self.v2:
            for line in self._read("cpu.stat").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            raise LookupError(f"no usage_usec in {self.path / 'cpu.stat'}")
        if self.cpuacct is None:
            raise LookupError("this process is in no cpuacct cgroup: /proc/self/cgroup names none")
        return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        return [int(pid) for pid in self._read("cgroup.procs").split()]

    def remove(self) -> None:
        """Removes the cgroup once its processes ended (waits up to 120 s for them, as long as a loaded machine may)."""
        deadline = time.monotonic() + 120
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.rmdir(self.path)
        if self.cpuacct is not None:
            os.rmdir(self.cpuacct)
