from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from sriov_cni.kernel import sysfs
from sriov_cni.node import config as node_config
from sriov_cni.node import setup as node_setup
from sriov_cni.node import vfs as node_vfs
from sriov_cni.vfstore import Allocation, FileStore
from tests.support.fakes import FakeLinks
from tests.support.nodetree import Tree

CONFIG = """
pfs:
  - pf: eth0
    numVfs: 3
    mtu: 9000
    tuning: {rps: true, rfsFlowEntries: 32768, xps: true}
"""


def run(text: str, tmp_path: Path, links: FakeLinks, dry: bool = False) -> list[str]:
    out: list[str] = []
    paths = links.tree.paths(tmp_path / "run" / "node.json")
    plan = node_setup.plan(node_config.parse(text), paths, tmp_path / "data", links)
    if dry:
        node_setup.show(plan, paths, out.append)
    else:
        node_setup.execute(plan, paths, out.append)
    return out


def test_dry_run_prints_the_plan_and_changes_nothing(
    tree: Tree, links: FakeLinks, tmp_path: Path, writes: list[tuple[str, str]]
) -> None:
    tree.igb(queues=2, up=False)
    out = run(CONFIG, tmp_path, links, dry=True)
    assert out == [
        "dry run: nothing is changed",
        "irqbalance: policy script bans the IRQs of 0000:01:00.0 and their VFs: would write if changed",
        "eth0 (0000:01:00.0): sriov_numvfs 0 -> 3: would change",
        "eth0 (0000:01:00.0): MTU 1500 -> 9000: would change",
        "eth0 (0000:01:00.0): link down -> up: would change",
        "eth0 (0000:01:00.0): new VFs opened and closed once: would change",
        "eth0 (0000:01:00.0): queue IRQs round robin over CPUs 0-7, RPS on 0-7, RFS 32768 flows, XPS: would change",
        "  IRQ 31 (eth0-TxRx-0) -> CPU 0",
        "  IRQ 32 (eth0-TxRx-1) -> CPU 1",
        "host: rps_sock_flow_entries 0 -> 32768: would change",
    ]
    assert writes == [] and links.calls == []
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


def test_run_applies_then_second_run_writes_nothing(
    tree: Tree, links: FakeLinks, tmp_path: Path, writes: list[tuple[str, str]]
) -> None:
    tree.igb(vfs=3, queues=2, up=False)
    out = run(CONFIG, tmp_path, links)
    script = tmp_path / "run" / "irqbalance-policy"
    assert out[:2] == [
        f"irqbalance: policy script {script} bans the IRQs of 0000:01:00.0 and their VFs: written",
        "eth0 (0000:01:00.0): sriov_numvfs 3: unchanged",
    ]
    assert links.calls == [("mtu", "eth0", 9000), ("up", "eth0", None)]
    assert tree.affinity(31) == "0" and tree.affinity(32) == "1"
    assert tree.affinity(30) == "0-7"  # the misc vector is left alone
    q = "class/net/eth0/queues"
    assert tree.read(f"{q}/rx-0/rps_cpus") == "000000ff"
    assert tree.read(f"{q}/rx-1/rps_flow_cnt") == "16384"  # 32768 over 2 queues
    assert tree.read(f"{q}/tx-1/xps_cpus") == "00000002"  # tx-1 follows IRQ 32 to CPU 1
    assert (tree.proc / "sys/net/core/rps_sock_flow_entries").read_text().strip() == "32768"
    state = json.loads((tmp_path / "run" / "node.json").read_text())
    assert state["pfs"]["0000:01:00.0"]["tuning"] == {
        "irq_cpus": list(range(8)),
        "rps_cpus": list(range(8)),
        "rfs_flow_entries": 32768,
        "xps": True,
    }
    assert state["pfs"]["0000:01:00.0"]["pins"] == {"31": 0, "32": 1}

    writes.clear()
    links.calls.clear()
    again = run(CONFIG, tmp_path, links)
    assert writes == [] and links.calls == []
    assert again == [
        f"irqbalance: policy script {script} bans the IRQs of 0000:01:00.0 and their VFs: unchanged",
        "eth0 (0000:01:00.0): sriov_numvfs 3: unchanged",
        "eth0 (0000:01:00.0): MTU 9000 (>= 9000): unchanged",
        "eth0 (0000:01:00.0): link up: unchanged",
        "eth0 (0000:01:00.0): queue IRQs round robin over CPUs 0-7, RPS on 0-7, RFS 32768 flows, XPS: "
        "2 IRQs unchanged, queue maps unchanged",
        "host: rps_sock_flow_entries 32768 (>= 32768): unchanged",
        f"state {tmp_path / 'run' / 'node.json'}: unchanged",
    ]


def test_mtu_is_never_lowered(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb(mtu=9000)
    out = run("pfs: [{pf: eth0, numVfs: 0, mtu: 1500}]", tmp_path, links)
    assert "eth0 (0000:01:00.0): MTU 9000 (>= 1500): unchanged" in out
    assert links.calls == []


def _allocation(tmp_path: Path, vf_pci: str, index: int, pf_pci: str = "0000:01:00.0") -> None:
    netns = tmp_path / "netns-a"
    netns.write_text("")
    FileStore(tmp_path / "data").put(
        Allocation(vf_pci, pf_pci, "eth0", index, "net-a", "c0ffee", "net1", str(netns), None)
    )


def test_count_change_refused_while_a_vf_is_allocated(
    tree: Tree, links: FakeLinks, tmp_path: Path, writes: list[tuple[str, str]]
) -> None:
    vfs = tree.igb(vfs=3)
    _allocation(tmp_path, vfs[1], 1)
    with pytest.raises(node_setup.SetupError) as info:
        run("pfs: [{pf: eth0, numVfs: 5}]", tmp_path, links)
    assert str(info.value) == (
        "refusing to change eth0 from 3 to 5 VFs: the change goes through 0 and would destroy "
        "allocated VFs: VF 1 (net-a, container c0ffee, net1)"
    )
    assert writes == []
    assert tree.read("bus/pci/devices/0000:01:00.0/sriov_numvfs") == "3"


def test_allocations_on_another_pf_do_not_block(
    tree: Tree, links: FakeLinks, tmp_path: Path, writes: list[tuple[str, str]]
) -> None:
    tree.igb(vfs=3)
    tree.igb("0000:02:00.0", "eth1", vfs=2)
    _allocation(tmp_path, "0000:02:10.0", 0, pf_pci="0000:02:00.0")
    run("pfs: [{pf: eth0, numVfs: 2}]", tmp_path, links)
    counts = [v for p, v in writes if p.endswith("0000:01:00.0/sriov_numvfs")]
    assert counts == ["0", "2"]  # a non-zero count changes through 0


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOMEM, "SR-IOV is disabled in the firmware/BIOS, or boot with pci=realloc"),
        (errno.ENOSPC, "no MSI-X interrupt vectors left"),
        (errno.ERANGE, "more VFs than the device supports"),
        (errno.ENOENT, "the PF has no driver"),
    ],
)
def test_kernel_errors_are_explained(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str
) -> None:
    tree.igb()

    def refuse(path: Path, value: str) -> None:
        raise sysfs.SysfsError("refused", code)

    monkeypatch.setattr(sysfs, "write", refuse)
    with pytest.raises(node_setup.SetupError) as info:
        run("pfs: [{pf: eth0, numVfs: 4}]", tmp_path, links)
    assert words in str(info.value)
    assert str(info.value).startswith("0000:01:00.0: cannot set sriov_numvfs to 4: ")


def test_fewer_vfs_than_asked_is_an_error(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.igb(vfs=2)
    real = sysfs.write

    def stingy(path: Path, value: str) -> None:
        real(path, "2" if path.name == "sriov_numvfs" and value == "7" else value)

    monkeypatch.setattr(sysfs, "write", stingy)
    with pytest.raises(node_setup.SetupError, match="asked for 7 VFs, the driver enabled 2"):
        run("pfs: [{pf: eth0, numVfs: 7}]", tmp_path, links)


def test_more_vfs_than_totalvfs_names_the_field(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb()
    with pytest.raises(
        node_setup.SetupError, match=r"^pfs\[0\]\.numVfs: 8 is more than eth0 supports \(sriov_totalvfs 7\)$"
    ):
        run("pfs: [{pf: eth0, numVfs: 8}]", tmp_path, links)


def test_unknown_pf_names_the_field(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    with pytest.raises(node_setup.SetupError, match=r"^pfs\[0\]\.pf: no network device 'eth9' on this node$"):
        run("pfs: [{pf: eth9, numVfs: 1}]", tmp_path, links)


def test_same_pf_by_name_and_address_is_refused(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb()
    with pytest.raises(
        node_setup.SetupError, match=r"pfs\[1\]\.pf: 0000:01:00.0 is 0000:01:00.0, which an earlier entry"
    ):
        run("pfs: [{pf: eth0, numVfs: 1}, {pf: '0000:01:00.0', numVfs: 1}]", tmp_path, links)


def test_numa_local_cpus_minus_isolated_and_excluded(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.cpus("0-15", isolated="5", nohz_full="6")
    tree.numa_node(1, "4-7,12-15")
    tree.igb(queues=4, numa=1)
    run("pfs: [{pf: eth0, numVfs: 0, tuning: {excludeCpus: 12}}]", tmp_path, links)
    assert [tree.affinity(irq) for irq in (31, 32, 33, 34)] == ["4", "7", "13", "14"]


def test_numa_node_minus_one_uses_local_cpulist(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb(queues=2, local="2-3")
    run("pfs: [{pf: eth0, numVfs: 0, tuning: {}}]", tmp_path, links)
    assert [tree.affinity(31), tree.affinity(32)] == ["2", "3"]


def test_more_queues_than_cpus_wraps(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb(queues=4)
    run("pfs: [{pf: eth0, numVfs: 0, tuning: {irqCpus: '1,3'}}]", tmp_path, links)
    assert [tree.affinity(irq) for irq in (31, 32, 33, 34)] == ["1", "3", "1", "3"]


def test_all_local_cpus_isolated_falls_back_to_the_rest(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.cpus("0-7", isolated="2-3")
    tree.igb(queues=2, local="2-3")
    run("pfs: [{pf: eth0, numVfs: 0, tuning: {}}]", tmp_path, links)
    assert [tree.affinity(31), tree.affinity(32)] == ["0", "1"]


def test_explicit_cpus_that_are_all_isolated_are_an_error(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.cpus("0-7", isolated="2-3")
    tree.igb()
    with pytest.raises(node_setup.SetupError, match=r"^pfs\[0\]\.tuning: irqCpus leaves no CPU"):
        run("pfs: [{pf: eth0, numVfs: 0, tuning: {irqCpus: 2-3}}]", tmp_path, links)


def test_offline_explicit_cpus_are_an_error(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb()
    with pytest.raises(node_setup.SetupError, match=r"irqCpus names CPUs that are not online: 8-9$"):
        run("pfs: [{pf: eth0, numVfs: 0, tuning: {irqCpus: 7-9}}]", tmp_path, links)


def test_kernel_managed_irqs_are_skipped_not_failed(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.igb(queues=2)
    real = sysfs.write

    def managed(path: Path, value: str) -> None:
        if path.parent.name == "32":
            raise sysfs.SysfsError("refused", errno.EIO)
        real(path, value)

    monkeypatch.setattr(sysfs, "write", managed)
    out = run("pfs: [{pf: eth0, numVfs: 0, tuning: {}}]", tmp_path, links)
    assert "1 IRQs pinned, 1 IRQs skipped (kernel-managed IRQs refuse user affinity)" in out[-2]
    assert tree.affinity(32) == "0-7"


def test_other_pin_failures_stop_setup(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.igb()

    def invalid(path: Path, value: str) -> None:
        raise sysfs.SysfsError(f"writing {value!r} to {path}: Invalid argument", errno.EINVAL)

    monkeypatch.setattr(sysfs, "write", invalid)
    with pytest.raises(node_setup.SetupError, match=r"^eth0: pinning IRQ 31 \(eth0-TxRx-0\) to CPU 0: writing"):
        run("pfs: [{pf: eth0, numVfs: 0, tuning: {}}]", tmp_path, links)
    assert not (tmp_path / "run" / "node.json").exists()


def test_nohz_full_null_means_no_cpu(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    # What Debian's 6.1 kernel shows when booted without nohz_full=.
    (tree.sys / "devices/system/cpu/nohz_full").write_text("(null)\n")
    tree.igb(queues=2)
    run("pfs: [{pf: eth0, numVfs: 0, tuning: {}}]", tmp_path, links)
    assert [tree.affinity(31), tree.affinity(32)] == ["0", "1"]


def test_new_vfs_are_opened_once_after_the_pf_link_is_up(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VFs setup creates are opened and closed once (see kernel/firstopen.py), after the PF's link is up.

    Fixture: the tree's VFs stand for the ones the sriov_numvfs write creates
    (the tree's numvfs file says 0 until then); the link changes are recorded.
    """
    tree.igb(vfs=2, up=False)
    numvfs = tree.sys / "bus/pci/devices/0000:01:00.0/sriov_numvfs"
    numvfs.write_text("0\n")

    def create(sys_root: Path, pf_pci: str, count: int, want_netdevs: bool) -> int:
        numvfs.write_text(f"{count}\n")
        return count

    monkeypatch.setattr(node_vfs, "set_numvfs", create)
    out = run("pfs: [{pf: eth0, numVfs: 2}]", tmp_path, links)
    assert "eth0 (0000:01:00.0): new VFs opened and closed once: 2 VFs" in out
    assert links.calls == [("up", "eth0", None), ("open once", "eth0v0", 0), ("open once", "eth0v1", 1)]

    links.calls.clear()
    again = run("pfs: [{pf: eth0, numVfs: 2}]", tmp_path, links)
    assert links.calls == [] and not any("opened and closed" in line for line in again)


def test_vfs_for_dpdk_are_not_opened(tree: Tree, links: FakeLinks, tmp_path: Path) -> None:
    tree.igb(up=False)
    plan = node_setup.plan(
        node_config.parse("pfs: [{pf: eth0, numVfs: 2, vfDriver: vfio-pci}]"),
        links.tree.paths(tmp_path / "node.json"),
        tmp_path / "data",
        links,
    )
    assert not any("opened and closed" in step.what for step in plan.steps)


def test_admin_macs_are_set_once_and_each_vf_rebound(
    tree: Tree, links: FakeLinks, tmp_path: Path, writes: list[tuple[str, str]]
) -> None:
    """adminMacs: mlx5 makes a VF's node GUID from the admin MAC its driver finds at bind (rdma_cm needs one)."""
    vfs = tree.igb(vfs=2)
    # The kernel's files a rebind writes (recorded here, not acted on: the VF stays on igbvf).
    (tree.sys / "bus" / "pci" / "drivers" / "igbvf").mkdir(parents=True, exist_ok=True)
    (tree.sys / "bus" / "pci" / "drivers" / "igbvf" / "unbind").write_text("")
    (tree.sys / "bus" / "pci" / "drivers_probe").write_text("")
    config = "pfs: [{pf: eth0, numVfs: 2, adminMacs: true}]\n"
    # An admin MAC the operator set is kept.
    links.macs[("eth0", 1)] = "02:00:00:00:00:07"
    out = run(config, tmp_path, links)
    assert (
        "eth0 (0000:01:00.0): VFs without an admin MAC given one, then rebound: 1 VFs given an admin MAC and rebound"
        in out
    )
    pf_mac = (tree.sys / "class" / "net" / "eth0" / "address").read_text().strip()
    assert links.macs == {("eth0", 0): node_setup.admin_mac(pf_mac, 0), ("eth0", 1): "02:00:00:00:00:07"}
    mac = links.macs[("eth0", 0)]
    assert int(mac[:2], 16) & 0x03 == 0x02, "not a locally administered unicast MAC"
    assert [w for w in writes if "unbind" in w[0] or "drivers_probe" in w[0]] == [
        ("sys/bus/pci/drivers/igbvf/unbind", vfs[0]),
        ("sys/bus/pci/drivers_probe", vfs[0]),
    ]
    writes.clear()
    again = run(config, tmp_path, links)
    assert "eth0 (0000:01:00.0): every VF has an admin MAC: unchanged" in again
    assert writes == []
    # Derived, not counted up: VF 1 of one PF is not VF 0 of the next one, whose MAC is one higher.
    assert node_setup.admin_mac("00:1b:21:00:00:01", 0) != node_setup.admin_mac("00:1b:21:00:00:00", 1)


def _run_announced(text: str, tmp_path: Path, links: FakeLinks) -> list[str]:
    """setup's progress lines and the lines it says before each long step (marked "before: "), in order."""
    both: list[str] = []
    paths = links.tree.paths(tmp_path / "run" / "node.json")
    plan = node_setup.plan(node_config.parse(text), paths, tmp_path / "data", links)
    node_setup.execute(plan, paths, both.append, lambda line: both.append(f"before: {line}"))
    return both


def _numvfs_as_the_kernel(tree: Tree, monkeypatch: pytest.MonkeyPatch, pf_pci: str = "0000:01:00.0") -> None:
    numvfs = tree.sys / f"bus/pci/devices/{pf_pci}/sriov_numvfs"

    def create(sys_root: Path, pf: str, count: int, want_netdevs: bool) -> int:
        numvfs.write_text(f"{count}\n")
        return count

    monkeypatch.setattr(node_vfs, "set_numvfs", create)


def test_a_line_is_said_before_sriov_numvfs_is_written_and_not_when_nothing_changes(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.igb(vfs=2, up=False)
    (tree.sys / "bus/pci/devices/0000:01:00.0/sriov_numvfs").write_text("0\n")
    _numvfs_as_the_kernel(tree, monkeypatch)
    both = _run_announced("irqbalance: leave\npfs: [{pf: eth0, numVfs: 2}]", tmp_path, links)
    assert both[:2] == [
        "before: eth0: creating 2 VFs (waiting up to 120 s for the driver)",
        "eth0 (0000:01:00.0): sriov_numvfs 0 -> 2: done",
    ]
    assert [line for line in both if line.startswith("before: ")] == [both[0]]
    again = _run_announced("irqbalance: leave\npfs: [{pf: eth0, numVfs: 2}]", tmp_path, links)
    assert not any(line.startswith("before: ") for line in again)


@pytest.mark.parametrize(
    "now, want, said",
    [
        (0, 4, "ens1f0: creating 4 VFs (mlx5 may take up to two minutes)"),
        (2, 4, "ens1f0: changing from 2 to 4 VFs, through 0 (mlx5 may take up to two minutes for each write)"),
        (2, 0, "ens1f0: removing its 2 VFs (mlx5 may take up to two minutes)"),
    ],
)
def test_mlx5_is_named_as_the_slow_one(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, now: int, want: int, said: str
) -> None:
    tree.pf("0000:3b:00.0", "ens1f0", numvfs=now, driver="mlx5_core")
    _numvfs_as_the_kernel(tree, monkeypatch, "0000:3b:00.0")
    both = _run_announced(f"irqbalance: leave\npfs: [{{pf: ens1f0, numVfs: {want}}}]", tmp_path, links)
    assert both[0] == f"before: {said}"
    assert both[1] == f"ens1f0 (0000:3b:00.0): sriov_numvfs {now} -> {want}: done"


def test_a_line_is_said_before_the_vfs_are_rebound(
    tree: Tree, links: FakeLinks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.igb(vfs=2)
    monkeypatch.setattr(node_vfs, "bind", lambda sys_root, vf, driver: True)
    (tree.sys / "bus/pci/drivers/vfio-pci").mkdir(parents=True, exist_ok=True)
    both = _run_announced("irqbalance: leave\npfs: [{pf: eth0, numVfs: 2, vfDriver: vfio-pci}]", tmp_path, links)
    i = both.index("before: eth0: binding its VFs to vfio-pci (each probe may take a second)")
    assert both[i + 1] == "eth0 (0000:01:00.0): VFs on vfio-pci: 2 VFs rebound"
