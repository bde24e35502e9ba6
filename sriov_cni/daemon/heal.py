"""The daemon's healing: a VF whose pod died without a DEL is given back within seconds, address and all.

A DEL that never comes is common: containerd never calls CNI GC, and the
runtime or the node may be killed mid-teardown, a sandbox removed while
the plugin was unreachable, a node rebooted with pods on it.  Left alone,
such a VF would sit in the host carrying the dead pod's PF-side MAC, VLAN,
rate and trust (a duplicate MAC on the wire once another VF takes that MAC)
and its address would stay reserved, until an ADD found no free VF.

So a process of its own, forked when the daemon starts (:func:`start`) and
ending with it, gives each such VF back as DEL does
(:func:`sriov_cni.plugin.commands.give_back_dead`: under the VF's claim,
PF-side settings, netdev, RDMA device and device-info file as recorded,
then the address through the network's own IPAM).  It sweeps the records:

* once at start, when every record of an earlier boot is stale;
* whenever the host's namespace announces a link (the kernel brings a
  dead namespace's VF netdev home and announces it) or withdraws a
  namespace's id (:mod:`sriov_cni.kernel.linkevents`);
* every :data:`SWEEP` seconds, for what announces nothing (a VF on a DPDK
  driver); sooner after a give-back that failed (:data:`RETRY`).

A record whose namespace lives is left alone, however its path went (a
bind mount elsewhere keeps it alive; see :func:`sriov_cni.vfstate.gone`),
and so is a VF whose netdev the kernel has not brought home yet.  Each
give-back is logged in one line and reported to the daemon's loop, one
line on a pipe, for its metrics.  Without a daemon (the executables run in
process) an ADD that finds no free VF still reclaims a stale one.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sriov_cni.cni import CNIError
from sriov_cni.daemon import budget
from sriov_cni.kernel import lifetime, sysfs
from sriov_cni.kernel.linkevents import LinkEvents
from sriov_cni.paths import Paths
from sriov_cni.plugin.commands import Deps, give_back_dead
from sriov_cni.vfstate import EARLIER_BOOT, gone
from sriov_cni.vfstore import Allocation, FileStore, scan_allocations

# The process's name (comm).
PROCESS_NAME = "sriov-cni-heal"
# Seconds between sweeps when nothing is announced.
SWEEP = 60.0
# Seconds before a sweep after one in which a give-back failed (a full
# state directory, a driver that refused), doubled while they keep failing,
# up to SWEEP.
RETRY = 2.0
# Seconds between sweeps at most as often: a host whose links change all
# the time (carrier flaps) must not keep the process reading records.
MIN_GAP = 0.2
# What a give-back reports to the daemon: why the pod was gone, and whether
# the VF is back as recorded.
GIVEN_BACK = "given_back"
FAILED = "failed"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launch:
    """The store to heal, the node it is on, and the OOM score the process runs at."""

    data_dir: Path
    paths: Paths
    # The daemon's oom_score_adj before it protected itself.
    score: int | None


def start(launch: Launch) -> tuple[int, int]:
    """Fork the healing process; the daemon's end of its alive pipe (held while the daemon lives), and of its reports.

    Forked twice, as the NRI plugin is: the daemon reaps every child it
    has as a call's.
    """
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    reports_r, reports_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the first fork, which only forks again
        try:
            if os.fork() == 0:
                lifetime.leave_daemon({0, 1, 2, alive_r, reports_w})
                lifetime.set_name(PROCESS_NAME)
                budget.unprotect(launch.score)
                _run(launch, alive_r, reports_w)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(alive_r)
    os.close(reports_w)
    os.set_blocking(reports_r, False)
    return alive_w, reports_r


def _run(launch: Launch, alive: int, reports: int) -> None:  # pragma: no cover - runs in the healing process
    logging.basicConfig(stream=sys.stderr, format="sriov-cni daemon: heal: %(message)s", level=logging.INFO)
    # The give-back's own steps log at INFO; here each is one line.
    logging.getLogger("sriov_cni.plugin").setLevel(logging.WARNING)
    healer = Healer(launch.data_dir, Deps(paths=launch.paths), os.environ, reports)
    events = LinkEvents()
    retry = RETRY
    while True:
        if healer.sweep():  # a give-back failed: again soon, then less and less often
            wait, retry = retry, min(SWEEP, 2 * retry)
        else:
            wait, retry = SWEEP, RETRY
        next_sweep = time.monotonic() + wait
        while True:
            ready, _, _ = select.select([alive, events.fileno()], [], [], max(0.0, next_sweep - time.monotonic()))
            if alive in ready:
                return
            if not ready or events.drain():
                break
        time.sleep(max(0.0, healer.last_sweep + MIN_GAP - time.monotonic()))
        events.drain()


class Healer:
    """Sweeps of the store at ``data_dir``: each VF whose pod is gone given back, reported on ``reports`` (a pipe's write end)."""

    def __init__(self, data_dir: Path, deps: Deps, env: Mapping[str, str], reports: int | None) -> None:
        self.data_dir = data_dir
        self.deps = deps
        self.env = env
        self.reports = reports
        self.last_sweep = 0.0
        # VFs already said to wait for their netdev, so a wait is logged once.
        self._waiting: set[str] = set()

    def sweep(self) -> bool:
        """Give back every VF whose pod is gone and whose netdev, if it has one, is home; whether a give-back failed."""
        self.last_sweep = time.monotonic()
        # Read without creating it: a node where the plugin never ran has no store.
        records, unreadable = scan_allocations(self.data_dir)
        for pci, problem in unreadable.items():
            logger.warning("VF %s: %s", pci, problem)
        failed = False
        for alloc in records:
            why = gone(alloc, self.deps.paths.proc)
            if why is not None and self._home(alloc, why):
                failed = not self._give_back(alloc, why) or failed
        return failed

    def _home(self, alloc: Allocation, why: str) -> bool:
        """Whether the kernel has brought the VF's netdev back to the host, where the pod had it.

        A namespace is torn down after its last holder went; until then the
        VF is in neither namespace, and a give-back now would find nothing to
        restore.  A VF without a netdev driver, or recorded in an earlier
        boot, is not waited for.
        """
        if alloc.dpdk or not alloc.in_pod or why == EARLIER_BOOT:
            return True
        driver, netdev = sysfs.driver_and_netdev(self.deps.paths.sys, alloc.vf_pci)
        if driver is None or netdev is not None:
            self._waiting.discard(alloc.vf_pci)
            return True
        if alloc.vf_pci not in self._waiting:
            self._waiting.add(alloc.vf_pci)
            logger.info(
                "VF %s: its pod's netns %s is gone; waiting for its netdev to come home", alloc.vf_pci, alloc.netns
            )
        return False

    def _give_back(self, alloc: Allocation, why: str) -> bool:
        """Give back one VF whose pod is gone (``why``); whether that did not fail."""
        started = time.monotonic()
        who = _who(alloc)
        try:
            done = give_back_dead(FileStore(self.data_dir), alloc, self.deps, self.env)
        except CNIError as exc:
            logger.error("VF %s of %s: giving it back failed: %s", alloc.vf_pci, who, exc)
            self._report(why, FAILED)
            return False
        except Exception as exc:  # one VF's failure must not end the healing of the others
            logger.error("VF %s of %s: giving it back failed: %r", alloc.vf_pci, who, exc)
            self._report(why, FAILED)
            return False
        if done is None:
            return True  # another call holds it, or it changed meanwhile
        logger.info(
            "gave back VF %s (PF %s VF %d) of %s: %s, no DEL came (%.2f s)",
            alloc.vf_pci,
            alloc.pf_netdev,
            alloc.vf_index,
            who,
            done,
            time.monotonic() - started,
        )
        self._report(done, GIVEN_BACK)
        return True

    def _report(self, why: str, result: str) -> None:
        if self.reports is not None:
            try:
                os.write(self.reports, f"{why}\t{result}\n".encode())
            except OSError:
                pass  # the daemon is ending: the alive pipe says so next


def _who(alloc: Allocation) -> str:
    pod = f"pod {alloc.pod_namespace}/{alloc.pod_name}" if alloc.pod_name else f"container {alloc.container_id[:12]}"
    return f"{pod} ({alloc.ifname} on network {alloc.network})"


def read_reports(fd: int, buffered: bytes) -> tuple[list[tuple[str, str]], bytes, bool]:
    """What the healing process reported since the last read: (why, result) pairs, the unfinished rest, and whether it ended."""
    data = buffered
    ended = False
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            ended = True
            break
        data += chunk
    *lines, rest = data.split(b"\n")
    pairs = []
    for line in lines:
        why, _, result = line.decode(errors="replace").partition("\t")
        pairs.append((why, result))
    return pairs, rest, ended
