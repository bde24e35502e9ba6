"""``rdmaNetnsMode`` in the node config: setup's boot option, the running kernel's switch, and its exit status.

Real: the modprobe.d file setup writes (in a tree), and, where a test says
so, the host kernel's own answer to NETLINK_RDMA: hosts of this suite have
no ib_core, which is the "not loaded" case.  Fixture: the sysfs tree of PFs,
and :class:`Modes`, a running kernel's RDMA core that answers the mode and
refuses a switch with EBUSY when told, as a kernel with pods does.  The
switch against a real RDMA core, with a real namespace making it wait, runs
in the 7.3 guest (tests/vm/test_rdma_kernel.py).
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from click.testing import CliRunner

from sriov_cni.cli import DEFERRED, main
from sriov_cni.kernel import nlerrors
from sriov_cni.node import config as node_config
from sriov_cni.node import rdmamode
from sriov_cni.node import setup as node_setup
from sriov_cni.paths import Paths
from tests.support.fakes import FakeLinks
from tests.support.hostkernel import has_rdma_netlink
from tests.support.nodetree import Tree


class Modes:
    """A running RDMA core: its mode, and whether another network namespace makes a switch EBUSY."""

    def __init__(self, mode: str | None, busy: bool = False) -> None:
        self.mode = mode
        self.busy = busy
        self.sets: list[str] = []

    def get(self) -> str | None:
        return self.mode

    def set(self, mode: str) -> None:
        self.sets.append(mode)
        if self.busy:
            raise nlerrors.Busy("setting the RDMA netns mode", errno.EBUSY)
        self.mode = mode


def config(mode: str | None) -> str:
    key = "" if mode is None else f"rdmaNetnsMode: {mode}\n"
    return key + "pfs: [{pf: eth0, numVfs: 0}]\n"


def run(
    mode: str | None, paths: Paths, tmp_path: Path, links: FakeLinks, modes: rdmamode.RdmaModes | None
) -> tuple[bool, list[str]]:
    """Setup's run; whether the node is as asked, and its lines about RDMA."""
    out: list[str] = []
    plan = node_setup.plan(node_config.parse(config(mode)), paths, tmp_path / "data", links, modes)
    as_asked = node_setup.execute(plan, paths, out.append)
    return as_asked, [line for line in out if "RDMA" in line]


def option(paths: Paths) -> str | None:
    path = rdmamode.option_path(paths.modprobe_dir)
    return path.read_text() if path.exists() else None


@pytest.fixture
def node(tree: Tree) -> Tree:
    tree.igb()
    return tree


def test_exclusive_writes_the_option_and_switches_then_a_second_run_changes_nothing(
    node: Tree, paths: Paths, tmp_path: Path, links: FakeLinks
) -> None:
    kernel = Modes("shared")
    as_asked, lines = run("exclusive", paths, tmp_path, links, kernel)
    path = rdmamode.option_path(paths.modprobe_dir)
    assert as_asked
    assert lines == [
        f"host: RDMA netns mode exclusive at boot ({path}): {path} written",
        "host: RDMA netns mode shared -> exclusive: done",
    ]
    assert option(paths) == rdmamode.EXCLUSIVE_OPTION
    assert "options ib_core netns_mode=0\n" in rdmamode.EXCLUSIVE_OPTION
    assert kernel.sets == ["exclusive"]
    before = path.stat().st_mtime_ns
    as_asked, lines = run("exclusive", paths, tmp_path, links, kernel)
    assert as_asked
    assert lines == [
        f"host: RDMA netns mode exclusive at boot ({path}): unchanged",
        "host: RDMA netns mode exclusive: unchanged",
    ]
    assert kernel.sets == ["exclusive"] and path.stat().st_mtime_ns == before


def test_a_busy_kernel_defers_to_the_next_boot_and_says_so(
    node: Tree, paths: Paths, tmp_path: Path, links: FakeLinks
) -> None:
    kernel = Modes("shared", busy=True)
    as_asked, lines = run("exclusive", paths, tmp_path, links, kernel)
    assert not as_asked
    assert option(paths) == rdmamode.EXCLUSIVE_OPTION
    assert kernel.mode == "shared" and kernel.sets == ["exclusive"]
    assert lines[1].startswith("host: RDMA netns mode shared -> exclusive: deferred: the running kernel stays shared")
    assert lines[2].startswith("not yet as asked: RDMA netns mode: the running kernel stays shared")
    assert "exclusive applies at the next boot" in lines[2]
    # Once the pods are gone, a new run switches; the file is left as it is.
    kernel.busy = False
    as_asked, lines = run("exclusive", paths, tmp_path, links, kernel)
    assert as_asked and lines[1] == "host: RDMA netns mode shared -> exclusive: done"
    assert lines[0].endswith(": unchanged")


def test_shared_removes_the_option_and_switches_back(
    node: Tree, paths: Paths, tmp_path: Path, links: FakeLinks
) -> None:
    kernel = Modes("shared")
    run("exclusive", paths, tmp_path, links, kernel)
    as_asked, lines = run("shared", paths, tmp_path, links, kernel)
    path = rdmamode.option_path(paths.modprobe_dir)
    assert as_asked and option(paths) is None and kernel.mode == "shared"
    assert lines == [
        f"host: RDMA netns mode shared at boot ({path}): {path} removed",
        "host: RDMA netns mode exclusive -> shared: done",
    ]


def test_a_changed_option_file_is_rewritten(node: Tree, paths: Paths, tmp_path: Path, links: FakeLinks) -> None:
    path = rdmamode.option_path(paths.modprobe_dir)
    path.parent.mkdir(parents=True)
    path.write_text("options ib_core netns_mode=1\n")
    as_asked, _ = run("exclusive", paths, tmp_path, links, Modes("exclusive"))
    assert as_asked and option(paths) == rdmamode.EXCLUSIVE_OPTION


def test_without_the_key_the_node_is_left_alone(node: Tree, paths: Paths, tmp_path: Path, links: FakeLinks) -> None:
    kernel = Modes("exclusive")
    as_asked, lines = run(None, paths, tmp_path, links, kernel)
    assert as_asked and lines == [] and kernel.sets == [] and option(paths) is None


def test_without_ib_core_the_option_waits_for_its_load(
    node: Tree, paths: Paths, tmp_path: Path, links: FakeLinks
) -> None:
    """Real: this host's kernel, which has no RDMA core: the mode applies when ib_core loads, and that is as asked."""
    if has_rdma_netlink():
        pytest.fail("this host's kernel has ib_core loaded; the test needs one without (the guest covers one with)")
    as_asked, lines = run("exclusive", paths, tmp_path, links, None)
    assert as_asked and option(paths) == rdmamode.EXCLUSIVE_OPTION
    assert lines[1] == "host: RDMA netns mode exclusive when ib_core loads (not loaded now): unchanged"


def test_the_command_exits_3_while_the_mode_waits_for_a_boot_or_0_when_allowed(
    node: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through click: the deferred switch is an operator's message on stdout and exit status 3, not an error."""
    kernel = Modes("shared", busy=True)
    monkeypatch.setattr(rdmamode, "KernelRdmaModes", lambda: kernel)
    conf = tmp_path / "node.yaml"
    conf.write_text(config("exclusive"))
    state = tmp_path / "state.json"
    args = ["setup", "--config", str(conf), "--data-dir", str(tmp_path / "data"), "--state-file", str(state)]
    result = CliRunner().invoke(main, args, obj=node.paths(state))
    assert result.exit_code == DEFERRED == 3, result.output
    assert "Error" not in result.output and "Traceback" not in result.output
    assert "not yet as asked: RDMA netns mode: the running kernel stays shared" in result.output
    # The DaemonSet's init container: the same message, and the daemon after it starts.
    result = CliRunner().invoke(main, [*args, "--allow-deferred"], obj=node.paths(state))
    assert result.exit_code == 0, result.output
    assert "not yet as asked: RDMA netns mode: the running kernel stays shared" in result.output
    assert kernel.mode == "shared"
    kernel.busy = False
    result = CliRunner().invoke(main, args, obj=node.paths(state))
    assert result.exit_code == 0, result.output
    assert kernel.mode == "exclusive"


def test_an_unknown_mode_is_a_config_error() -> None:
    with pytest.raises(node_config.NodeConfigError, match="rdmaNetnsMode: must be one of exclusive, shared"):
        node_config.parse("rdmaNetnsMode: private\npfs: [{pf: eth0, numVfs: 1}]")
