"""Where a plugin call's time goes, by phase, from the daemon child's cProfile dump.

A phase is named by the functions that start it (``PHASES``).  Each
function's own time is charged to the innermost phase it ran under: to the
phase it starts, or else to its callers' phases in proportion to the time
each caller spent in it (cProfile keeps caller edges, not whole stacks, so a
helper shared by two phases is split by that proportion).  Time in no phase
is "other" (dispatch, the logger, the call's bookkeeping).  The shares add
up to the profiled total; cProfile's own overhead inflates Python-heavy
phases over those waiting on the kernel or a child process.
"""

from __future__ import annotations

import pstats
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

# (file name, function) -> phase; "*" matches every function of the file.
PHASES: dict[tuple[str, str], str] = {
    ("cni.py", "_parse_invocation"): "config parse",
    ("config.py", "*"): "config parse",
    ("commands.py", "_configure_log"): "logging setup",
    ("log.py", "configure"): "logging setup",
    ("vfstore.py", "*"): "store claims + read/write (fsync)",
    ("store.py", "*"): "store claims + read/write (fsync)",
    ("lease.py", "*"): "store claims + read/write (fsync)",
    ("allocate.py", "*"): "allocation (pool, VF state)",
    ("commands.py", "_candidates"): "allocation (pool, VF state)",
    ("attach.py", "snapshot"): "PF settings (snapshot, apply, restore)",
    ("attach.py", "apply_pf_settings"): "PF settings (snapshot, apply, restore)",
    ("attach.py", "restore_pf_settings"): "PF settings (snapshot, apply, restore)",
    ("attach.py", "into_pod"): "move/attach (and back)",
    ("attach.py", "restore_netdev"): "move/attach (and back)",
    ("tuning.py", "*"): "VF tuning (IRQs, queues)",
    ("carrier.py", "await_carrier"): "carrier wait",
    ("carrier.py", "train"): "first open of a new VF",
    ("rdma.py", "*"): "RDMA device (move, lookup)",
    ("delegate.py", "*"): "IPAM",
    ("infofile.py", "*"): "device-info file",
    ("deviceinfo.py", "*"): "device-info file",
    ("commands.py", "_configure_ips"): "pod addresses + routes",
    ("commands.py", "_result"): "result",
    ("cni.py", "_emit"): "result",
    ("handles.py", "session"): "netlink sockets + netns entry",
    ("handles.py", "open_namespace"): "netlink sockets + netns entry",
    ("commands.py", "cmd_add"): "netns checks, look-ups",
    ("commands.py", "cmd_del"): "netns checks, look-ups",
    ("commands.py", "_pod_netns"): "netns checks, look-ups",
    ("commands.py", "_add"): "netns checks, look-ups",
    ("commands.py", "_refuse_recorded"): "netns checks, look-ups",
    ("commands.py", "_refuse_taken_name"): "netns checks, look-ups",
    ("commands.py", "_not_host"): "netns checks, look-ups",
}
OTHER = "other"
# The function each netlink request passes through once (revisions before
# it, on pyroute2's IPRoute, have no such function: no count is shown for them).
REQUESTS = (("sriov_cni/kernel/rtnl.py", "_exchange"),)

# The request for a PF's VF info: the kernel answers it with every VF of
# the PF, holding RTNL the while (KernelVfControl.vfs).
VF_INFO_DUMP = ("vfcontrol.py", "vfs")

Func = tuple[str, int, str]


def _phase_of(func: Func) -> str | None:
    name = Path(func[0]).name
    return PHASES.get((name, func[2])) or PHASES.get((name, "*"))


def breakdown(prof: Path) -> tuple[dict[str, float], dict[str, float], float]:
    """Seconds and netlink requests per phase, and the profiled total, from one cProfile dump.

    Time is split among callers by the time spent from each; requests by
    the number of calls from each (a slow move must not draw the cheap
    look-ups of other phases to itself).
    """
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]

    def sharer(weight: int) -> Callable[[Func], dict[str, float]]:
        """Phase shares of a function, following caller edges weighted by ``weight`` (an index in an edge)."""
        shares: dict[Func, dict[str, float]] = {}
        visiting: set[Func] = set()

        def share(func: Func) -> dict[str, float]:
            if func in shares:
                return shares[func]
            phase = _phase_of(func)
            if phase is not None:
                shares[func] = {phase: 1.0}
                return shares[func]
            callers = stats[func][4] if func in stats else {}
            weights = {caller: edge[weight] for caller, edge in callers.items() if caller not in visiting}
            total = sum(weights.values())
            if not weights or total <= 0:
                return {OTHER: 1.0}
            visiting.add(func)
            out: dict[str, float] = defaultdict(float)
            for caller, value in weights.items():
                for name, part in share(caller).items():
                    out[name] += part * value / total
            visiting.discard(func)
            shares[func] = dict(out)
            return shares[func]

        return share

    by_time, by_calls = sharer(3), sharer(1)  # an edge is (primitive calls, calls, own time, cumulative time)
    seconds: dict[str, float] = defaultdict(float)
    requests: dict[str, float] = defaultdict(float)
    for func, (_, calls, own, _, _) in stats.items():
        for name, part in by_time(func).items():
            seconds[name] += own * part
        if any(func[0].endswith(path) and func[2] == name for path, name in REQUESTS):
            for name, part in by_calls(func).items():
                requests[name] += calls * part
    return dict(seconds), dict(requests), sum(entry[2] for entry in stats.values())


def calls(prof: Path, func: tuple[str, str]) -> int:
    """How often one function (file name, function name) ran in one cProfile dump."""
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    return sum(entry[1] for f, entry in stats.items() if (Path(f[0]).name, f[2]) == func)


def table(title: str, prof: Path, unprofiled: float | None) -> list[str]:
    seconds, requests, total = breakdown(prof)
    lines = [
        f"{title}: {total * 1000:.1f} ms under cProfile"
        + (f" ({unprofiled * 1000:.1f} ms without)" if unprofiled is not None else "")
        + (f", {sum(requests.values()):.0f} netlink requests" if requests else "")
    ]
    lines.append(f"  {'phase':42} {'ms':>8} {'share':>6}" + (f" {'netlink':>7}" if requests else ""))
    for name, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        count = f" {requests.get(name, 0):7.0f}" if requests else ""
        lines.append(f"  {name:42} {value * 1000:8.1f} {value / total:6.1%}{count}")
    return lines
