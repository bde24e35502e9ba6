"""The host test fixtures as a node for the benchmarks: no SR-IOV NIC needed.

:class:`HostNode` builds PFs whose "VFs" are veth ends in a temporary sysfs
(tests/support/pluginlib.py); run as a program, this module is the sriov-cni
daemon for such a node: the real :func:`sriov_cni.daemon.server.serve`, with
the node paths pointing at the tree and the PF side (the one thing a veth
cannot stand in for) kept in memory by ``FakeVfControl``.  Every child of
the daemon starts from the daemon's copy of it, which holds as long as the
benchmark's configurations ask for no PF-side settings.

    [SRIOV_BENCH_CODE=DIR] python3 tests/support/hostnode.py SYSFS_ROOT SOCKET PF_NETDEV:NUMVFS ... \
        [calls=N] [metrics=HOST:PORT data=DIR]

``calls=N`` is the daemon's ``--calls-per-child``, ``metrics`` and ``data``
its ``--metrics-address`` and ``--data-dir``; ``vfstats=FILE`` gives the
PFs' VF counters its exporter reads (``FileVfStats``: a veth's PF side
has none), with ``vfstats_log=FILE`` recording each PF read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# The package to serve: this checkout's, or another revision's (CODE_ENV) to
# measure against; then this checkout, for tests.support.
CODE_ENV = "SRIOV_BENCH_CODE"
sys.path[:0] = [os.environ.get(CODE_ENV, str(ROOT)), str(ROOT)]

from sriov_cni.daemon import install, server  # noqa: E402
from sriov_cni.kernel import sysfs  # noqa: E402
from sriov_cni.plugin import commands  # noqa: E402
from sriov_cni.vfstore import FileStore  # noqa: E402
from tests.support.fakes import FakeVfControl, FileVfStats  # noqa: E402
from tests.support.pluginlib import Node  # noqa: E402

try:
    from sriov_cni.daemon.child import PROGRAMS
except ImportError:  # a baseline revision from before child.py: in programs.py, or earlier in server
    try:
        from sriov_cni.daemon.programs import PROGRAMS  # type: ignore[import-not-found,no-redef]
    except ImportError:
        PROGRAMS = server.PROGRAMS  # type: ignore[attr-defined]


class HostNode:
    """``pfs`` PFs of ``vfs_per_pf`` veth VFs each, in a sysfs tree under ``work``."""

    def __init__(self, work: Path, pfs: int, vfs_per_pf: int) -> None:
        self.node = Node(work)
        for _ in range(pfs):
            self.node.add_pf(vfs_per_pf, total=vfs_per_pf)

    def daemon_command(self, socket_path: str, *options: str) -> list[str]:
        """``options``: the daemon's, as ``calls=N`` and the like (see main)."""
        pfs = [f"{pf.name}:{len(pf.vfs)}" for pf in self.node.pfs]
        return [sys.executable, str(Path(__file__).resolve()), str(self.node.sys), socket_path, *pfs, *options]

    def close(self) -> None:
        self.node.cleanup()


GO_PLUGINS = Path("/usr/lib/cni")


@dataclass(frozen=True)
class BenchNode:
    work: Path  # the benchmark's scratch directory
    node: HostNode
    bindir: Path  # the static shim as sriov and sriov-ipam, and the Go plugins asked for
    pods: list[str]  # one network namespace per VF, as /var/run/netns paths


@contextmanager
def bench_node(prefix: str, vfs: int, go_plugins: tuple[str, ...]) -> Iterator[BenchNode]:
    """One PF of ``vfs`` veth VFs, a CNI bin dir and a pod namespace per VF; all of it removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix=f"sriov-{prefix}-"))
    node = HostNode(work / "node", 1, vfs)
    names: list[str] = []
    try:
        bindir = work / "bin"
        install.install(str(bindir))
        for plugin in go_plugins:
            os.symlink(GO_PLUGINS / plugin, bindir / plugin)
        token = uuid.uuid4().hex[:5]
        for i in range(vfs):
            names.append(f"sriov-{prefix}-{token}-{i}")
            subprocess.run(["ip", "netns", "add", names[-1]], check=True)
        yield BenchNode(work, node, bindir, [f"/var/run/netns/{name}" for name in names])
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], check=False)
        node.close()
        shutil.rmtree(work, ignore_errors=True)


def configure_logging(env: Mapping[str, str]) -> None:
    try:
        from sriov_cni import log
    except ImportError:  # a baseline revision kept it in the plugin, with its own entry
        commands.configure_logging_from_env(env)  # type: ignore[attr-defined]
        return
    log.configure_from_env(commands.PROGRAM, env)


def main() -> None:
    sys_root, socket_path, *pfs = sys.argv[1:]
    # The daemon's options, as "calls=N" and the like among the PFs.
    options = dict(arg.split("=", 1) for arg in pfs if "=" in arg)
    pfs = [arg for arg in pfs if "=" not in arg]
    fake = FakeVfControl()
    for spec in pfs:
        name, count = spec.rsplit(":", 1)
        fake.add_pf(name, int(count))
    kwargs: dict[str, Any] = {}
    if hasattr(sysfs, "SYS"):
        # A baseline revision from before the node paths were passed down
        # reads sysfs' root from this global.
        sysfs.SYS = Path(sys_root)
        deps = commands.Deps(vf_control=lambda: fake, store=FileStore)
    else:
        from sriov_cni.paths import Paths

        kwargs["paths"] = Paths(sys=Path(sys_root))
        deps = commands.Deps(vf_control=lambda: fake, store=FileStore, paths=kwargs["paths"])

    def run_sriov(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str], *host: Any) -> int:
        configure_logging(env)
        # The store the daemon opens for the call (its claims timed), where it passes one.
        store = getattr(host[0], "store", deps.store) if host else deps.store
        return commands.run(env, stdin, stdout, stderr, replace(deps, store=store))

    PROGRAMS["sriov"] = run_sriov
    # Only the options given: a baseline revision's daemon may not have them.
    if "calls" in options:
        kwargs["calls_per_child"] = int(options["calls"])
    if "metrics" in options:
        kwargs["metrics_address"] = parse_address(options["metrics"])
        kwargs["data_dir"] = Path(options["data"])
    if "vfstats" in options:
        log = Path(options["vfstats_log"]) if "vfstats_log" in options else None
        stats = FileVfStats(Path(options["vfstats"]), log)
        kwargs["vf_stats"] = lambda: stats
    try:
        from sriov_cni.daemon.options import Options
    except ImportError:  # a baseline revision from before the daemon took one options value
        server.serve(socket_path, **kwargs)  # type: ignore[arg-type]
        return
    from sriov_cni.daemon.measure import Measure

    if "heal" in Options.__dataclass_fields__:
        # The PF side here is the fixture's, which the healing process's
        # own VF control would not reach.
        kwargs["heal"] = False
    server.serve(Options(socket=socket_path, measure=Measure.from_env(), **kwargs))


def parse_address(text: str) -> tuple[str, int]:
    try:
        from sriov_cni.daemon.exporter import parse_address
    except ImportError:  # a baseline revision kept it with the metrics
        from sriov_cni.daemon.metrics import parse_address  # type: ignore[attr-defined,no-redef]
    return parse_address(text)


if __name__ == "__main__":
    main()
