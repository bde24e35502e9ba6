"""apply_vf_tuning / clear_vf_tuning, the hook the plugin calls around a pod's VF."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sriov_cni.kernel import sysfs
from sriov_cni.node import config as node_config
from sriov_cni.node import setup as node_setup
from sriov_cni.plugin import tuning
from tests.support.fakes import FakeLinks
from tests.support.nodetree import Tree

VF1 = "0000:01:10.1"


def vf1(tree: Tree) -> sysfs.VF:
    """VF 1 as ADD hands it to the hook: its PF and index resolved from the tree's sysfs."""
    return sysfs.resolve_vf(tree.sys, VF1)


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "run" / "node.json"


def setup_node(tree: Tree, links: FakeLinks, tmp_path: Path, state_file: Path, tuning_yaml: str) -> None:
    tree.igb(vfs=3)
    config = node_config.parse(f"pfs: [{{pf: eth0, numVfs: 3, tuning: {tuning_yaml}}}]")
    paths = tree.paths(state_file)
    node_setup.execute(node_setup.plan(config, paths, tmp_path / "data", links), paths, lambda line: None)


def test_no_state_file_means_nothing_done(
    tree: Tree, state_file: Path, fake_netlink: list[str | None], writes: list[tuple[str, str]]
) -> None:
    tree.igb(vfs=3)
    assert tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "net1") == []
    tuning.clear_vf_tuning(tree.paths(state_file), VF1)
    assert writes == [] and fake_netlink == []


def test_pf_without_policy_means_nothing_done(
    tree: Tree,
    links: FakeLinks,
    tmp_path: Path,
    state_file: Path,
    fake_netlink: list[str | None],
    writes: list[tuple[str, str]],
) -> None:
    tree.igb(vfs=3)
    paths = tree.paths(state_file)
    node_setup.execute(
        node_setup.plan(node_config.parse("pfs: [{pf: eth0, numVfs: 3}]"), paths, tmp_path / "data", links),
        paths,
        lambda line: None,
    )
    assert tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "net1") == []
    assert writes == [] and fake_netlink == []


def test_apply_pins_the_vf_queues_and_sets_rps_in_the_pod(
    tree: Tree, links: FakeLinks, tmp_path: Path, state_file: Path, fake_netlink: list[str | None]
) -> None:
    setup_node(tree, links, tmp_path, state_file, "{irqCpus: 0-3, rps: true, rfsFlowEntries: 4096, xps: true}")
    # VF 1 (IRQs 103 tx-0, 104 rx-0, 105 misc) is the single-queue igbvf
    # shape; the pod sees it as eth0v1 in this tree.
    assert tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "eth0v1") == []
    # VF i starts i+1 CPUs after the PF's first; rx and tx of a queue share it.
    assert [tree.affinity(103), tree.affinity(104)] == ["2", "2"]
    assert tree.affinity(105) == "0-7"
    assert fake_netlink == ["/run/netns/pod"]
    assert tree.read("class/net/eth0v1/queues/rx-0/rps_cpus") == "0000000f"
    assert tree.read("class/net/eth0v1/queues/rx-0/rps_flow_cnt") == "4096"


def test_apply_pins_through_proc_irq_mounted_elsewhere(
    tree: Tree, links: FakeLinks, tmp_path: Path, state_file: Path, fake_netlink: list[str | None]
) -> None:
    # The daemon in a container that is not privileged (--proc-irq): /proc/irq
    # is read-only there, the host's is mounted writable at another path.
    setup_node(tree, links, tmp_path, state_file, "{irqCpus: 0-3}")
    mounted = tmp_path / "host-proc-irq"
    shutil.copytree(tree.proc / "irq", mounted)
    assert (
        tuning.apply_vf_tuning(replace(tree.paths(state_file), proc_irq=mounted), vf1(tree), "/run/netns/pod", "eth0v1")
        == []
    )
    assert [(mounted / str(irq) / "smp_affinity_list").read_text() for irq in (103, 104)] == ["2", "2"]
    assert [tree.affinity(103), tree.affinity(104)] == ["0-7", "0-7"]


def test_apply_on_a_vf_that_is_down_warns(
    tree: Tree, links: FakeLinks, tmp_path: Path, state_file: Path, fake_netlink: list[str | None]
) -> None:
    setup_node(tree, links, tmp_path, state_file, "{}")
    for irq in (103, 104, 105):
        (tree.proc / "irq" / str(irq) / f"eth0v1{'-tx-0' if irq == 103 else '-rx-0' if irq == 104 else ''}").rmdir()
    assert tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "net1") == [
        f"VF {VF1} has no queue IRQs to pin (is net1 up?)"
    ]


def test_apply_reports_a_pod_side_failure_as_a_warning(
    tree: Tree, links: FakeLinks, tmp_path: Path, state_file: Path, fake_netlink: list[str | None]
) -> None:
    setup_node(tree, links, tmp_path, state_file, "{rps: true}")
    warnings = tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "nosuch")
    assert len(warnings) == 1 and warnings[0].startswith(f"VF {VF1} RPS/XPS on nosuch: nosuch: no queues in sysfs")


def test_a_corrupt_state_file_is_a_warning(tree: Tree, state_file: Path, fake_netlink: list[str | None]) -> None:
    tree.igb(vfs=3)
    state_file.parent.mkdir(parents=True)
    state_file.write_text("{")
    [warning] = tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "net1")
    assert warning.startswith(f"{state_file} is not valid JSON")


def test_release_puts_irqs_back_to_the_default_and_clears_queue_maps(
    tree: Tree, links: FakeLinks, tmp_path: Path, state_file: Path, fake_netlink: list[str | None]
) -> None:
    setup_node(tree, links, tmp_path, state_file, "{irqCpus: 0-3, rps: true, rfsFlowEntries: 4096}")
    (tree.proc / "irq" / "default_smp_affinity").write_text("0000003f\n")
    tuning.apply_vf_tuning(tree.paths(state_file), vf1(tree), "/run/netns/pod", "eth0v1")
    tuning.clear_vf_tuning(tree.paths(state_file), VF1, "/run/netns/pod", "eth0v1")
    assert fake_netlink == ["/run/netns/pod", "/run/netns/pod"]
    assert [(tree.proc / "irq" / str(irq) / "smp_affinity").read_text().strip() for irq in (103, 104)] == [
        "0000003f"
    ] * 2
    assert tree.read("class/net/eth0v1/queues/rx-0/rps_cpus") == "0"
    assert tree.read("class/net/eth0v1/queues/rx-0/rps_flow_cnt") == "0"
