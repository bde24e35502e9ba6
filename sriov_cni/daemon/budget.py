"""How many calls the daemon runs at once, and whom the kernel kills first.

Every call runs in a forked child of the daemon, and each child holds the
pages it wrote since the fork (see CHILD_COST).  A burst of pod starts with
one child per call would grow the daemon's cgroup past its limit, and the
kernel's OOM killer would then pick the daemon itself, failing every call in
flight.  So the daemon admits only as many children as its memory budget
holds (:func:`admission`); the calls beyond wait in the listen queue, where
the shim waits for its answer.  The requests the daemon reads meanwhile
(intake) hold memory of the same budget: their share is set aside first.

The budget is the daemon's cgroup limit: ``memory.max`` on cgroup v2,
``memory.limit_in_bytes`` on cgroup v1, the lowest along the path up to the
hierarchy's root (a parent's limit binds its children too), or the size
given with ``--memory-budget``.

Where the kernel kills anyway (a node-wide OOM, a limit set too tight for
the daemon's own size) it should take one call, not the daemon: the daemon
makes itself unkillable by the OOM killer (:func:`protect_daemon`), each
child the first choice (:func:`expose_child`).  On cgroup v2 the kernel
spares a task at OOM_SCORE_ADJ_MIN even when ``memory.oom.group`` (which the
kubelet sets on containers) kills the rest of the group: the calls die, the
daemon serves the runtime's retries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sriov_cni import sizes, wire

MiB = 1 << 20
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF = Path("/proc/self")
# Memory one child adds to the daemon's cgroup while it serves an ADD with a
# delegated IPAM plugin: the daemon's pages it writes (Python writes the
# reference count of every object it merely uses), its own heap, and the
# IPAM executable it runs.  Assumed only until the first child has served a
# call: each child then reports the memory it alone holds (private_bytes),
# and the cap follows the largest (Admission.children_at), so it holds for
# another Python, another plugin configuration or a later version of the
# code.  The IPAM executable runs for a few milliseconds of a call and is
# left to HEADROOM.  Measured with tests/bench/bench_burst.py on the host
# fixtures with host-local: 6.4 MiB per child at a cap of 13.
CHILD_COST = 7 * MiB
# Bytes of requests the daemon reads at once, by their announced lengths,
# when no budget bounds it: an honest request is a few KiB.
PENDING_BYTES = 32 * MiB
# With a budget, the requests being read get this share of it (5 MiB of
# 160 MiB: still a thousand honest requests), and never less than one
# request of the largest size the wire allows.
PENDING_SHARE = 1 / 32
# Kept free of children: page cache the calls' files and logs fill, a
# larger-than-measured call, and what the kernel charges beside the pages
# (page tables, socket buffers).
HEADROOM = 1 / 8
# The daemon must never be the OOM killer's choice (-1000 exempts it, even
# from memory.oom.group); a call's child is the cheapest thing to lose, as
# its runtime retries it.
DAEMON_OOM_SCORE_ADJ = -1000
CHILD_OOM_SCORE_ADJ = 1000
# Values at or above this in a limit file mean no limit (cgroup v1 writes
# PAGE_COUNTER_MAX in bytes, rounded to the page size).
_UNLIMITED = 1 << 62


class BudgetError(ValueError):
    """A budget given on the command line that is not a size."""


def parse_size(text: str) -> int:
    """Bytes from a size as Kubernetes writes one: ``160Mi``, ``200M``, ``167772160``.

    A bare number under a MiB is refused: no daemon runs in that, and
    ``--memory-budget 160`` meant 160Mi.
    """
    size = sizes.parse(text)
    if size is None:
        raise BudgetError(f"{text!r} is not a size: {sizes.EXPECTED}")
    if size < 1 << 20 and text.strip().isdigit():
        raise BudgetError(f"{text!r} is {size} bytes, less than a MiB: give its unit ({text.strip()}Mi?)")
    return size


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit() or int(text) >= _UNLIMITED:
        return None
    return int(text)


@dataclass(frozen=True)
class MemoryCgroup:
    """The memory cgroup a process is in: its directory, under the hierarchy's mount."""

    mount: Path
    path: Path
    v2: bool

    @property
    def limit_file(self) -> str:
        return "memory.max" if self.v2 else "memory.limit_in_bytes"

    def lowest_limit(self) -> tuple[int, Path] | None:
        """The lowest limit from this cgroup up to the mount's root, and the file that sets it."""
        here = self.path
        lowest: tuple[int, Path] | None = None
        while True:
            limit = _read_limit(here / self.limit_file)
            if limit is not None and (lowest is None or limit < lowest[0]):
                lowest = (limit, here / self.limit_file)
            if here == self.mount:
                return lowest
            here = here.parent


def memory_cgroup(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF) -> MemoryCgroup | None:
    """The memory cgroup of the process ``proc`` names, as mounted under ``root``; None without one."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            # cgroup v1, or a hybrid host whose memory controller is on v1.
            found = MemoryCgroup(root / "memory", root / "memory" / path.lstrip("/"), False)
            break
        if controllers == "" and (root / "cgroup.controllers").exists():
            found = MemoryCgroup(root, root / path.lstrip("/"), True)
    if found is None or not found.mount.is_dir():
        return None
    if not found.path.is_dir():
        # Without a cgroup namespace of its own, a container sees the host's
        # path in /proc/self/cgroup but only its own subtree mounted: the
        # mount's root is then its cgroup.
        return MemoryCgroup(found.mount, found.mount, found.v2)
    return found


def cgroup_limit(root: Path = CGROUP_ROOT, proc: Path = PROC_SELF) -> tuple[int, Path] | None:
    """This process's memory limit from its cgroups, and the file that sets it; None when unlimited."""
    cgroup = memory_cgroup(root, proc)
    return None if cgroup is None else cgroup.lowest_limit()


def private_bytes(proc: Path = PROC_SELF) -> int:
    """Memory only this process holds: the pages it wrote since its fork (or the daemon did), or mapped anew.

    Reading it takes about half a millisecond in a child of the daemon.
    """
    total = 0
    with open(proc / "smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def resident_bytes(proc: Path = PROC_SELF) -> int:
    """The process's resident memory now (VmRSS)."""
    for line in (proc / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS in {proc / 'status'}")


@dataclass(frozen=True)
class Admission:
    """How many calls run at once, how many bytes of requests are read meanwhile, and why."""

    children: int
    budget: int | None
    source: str
    pending_bytes: int = PENDING_BYTES
    # The daemon's size when it started serving, and --max-children.
    daemon_bytes: int = 0
    most: int = 0

    def describe(self) -> str:
        calls = f"at most {self.children} call{'s' if self.children > 1 else ''} at once"
        if self.budget is None:
            return f"{calls} (no memory limit found: --max-children)"
        return (
            f"{calls} and {self.pending_bytes / MiB:.1f} MiB of requests being read "
            f"(memory budget {self.budget / MiB:.0f} MiB from {self.source})"
        )

    def children_at(self, child: int) -> int:
        """The cap once a child is known to hold ``child`` bytes."""
        if self.budget is None:
            return self.children
        return min(self.most, children_for(self.budget, self.daemon_bytes, child))


def pending_for(budget: int) -> int:
    """Bytes of requests being read that ``budget`` sets aside."""
    return max(wire.MAX_REQUEST, min(PENDING_BYTES, int(budget * PENDING_SHARE)))


def children_for(budget: int, daemon: int, child: int = CHILD_COST) -> int:
    """Children that fit in ``budget`` bytes beside a daemon of ``daemon`` bytes and its requests; at least one."""
    return max(1, int((budget * (1 - HEADROOM) - daemon - pending_for(budget)) // child))


def admission(
    max_children: int, flag: int | None = None, root: Path = CGROUP_ROOT, proc: Path = PROC_SELF
) -> Admission:
    """The daemon's cap on concurrent calls: the budget's, never above ``max_children``.

    Called once the daemon has imported and warmed everything, so that its
    own size is what every child is forked from.
    """
    if flag is not None:
        budget, source = flag, "--memory-budget"
    else:
        found = cgroup_limit(root, proc)
        if found is None:
            return Admission(max_children, None, "")
        budget, source = found[0], str(found[1])
    daemon = resident_bytes(proc)
    return Admission(
        min(max_children, children_for(budget, daemon)), budget, source, pending_for(budget), daemon, max_children
    )


def oom_score_adj(proc: Path = PROC_SELF) -> int | None:
    """This process's oom_score_adj (the runtime's for the container, before :func:`protect_daemon`); None unread."""
    try:
        return int((proc / "oom_score_adj").read_text())
    except (OSError, ValueError):
        return None


def _set_oom_score_adj(value: int) -> None:
    with open(PROC_SELF / "oom_score_adj", "w") as f:
        f.write(str(value))


def protect_daemon() -> str | None:
    """Exempt the daemon from the OOM killer; a warning when the kernel refuses.

    Lowering the value needs CAP_SYS_RESOURCE (root has it, a privileged
    container too).  Each child forked afterwards inherits it until
    :func:`expose_child`.
    """
    try:
        _set_oom_score_adj(DAEMON_OOM_SCORE_ADJ)
    except OSError as exc:
        return (
            f"cannot exempt the daemon from the OOM killer (oom_score_adj {DAEMON_OOM_SCORE_ADJ}: "
            f"{exc.strerror}; it needs CAP_SYS_RESOURCE): its children are still killed first, "
            "but an OOM that finds none, or memory.oom.group, takes the daemon too"
        )
    return None


def expose_child() -> None:
    """Make this freshly forked child the OOM killer's first choice (raising needs no privilege)."""
    try:
        _set_oom_score_adj(CHILD_OOM_SCORE_ADJ)
    except OSError:
        # A /proc mounted read-only: the child serves calls all the same (a
        # child that ended here would be forked again at once, forever).
        pass


def unprotect(score: int | None) -> None:
    """In a process forked from the protected daemon: back to ``score``, an :func:`oom_score_adj` read before.

    Raising the value needs no privilege.
    """
    if score is None:
        return  # /proc could not be read: it cannot be written either
    try:
        _set_oom_score_adj(score)
    except OSError:
        pass  # a /proc mounted read-only: the process runs protected, as the daemon
