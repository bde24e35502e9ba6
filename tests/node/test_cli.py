"""The sriov-cni command through click: setup output and errors, status table and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sriov_cni import __version__
from sriov_cni.cli import main
from sriov_cni.node import setup as node_setup
from sriov_cni.node import status as node_status
from sriov_cni.node import vfs as node_vfs
from sriov_cni.vfstore import Allocation, FileStore
from tests.support.nodetree import Tree

REPO = Path(__file__).resolve().parents[2]


def invoke(tree: Tree, *args: str) -> tuple[int, str]:
    """The command on ``tree``'s node, setup's state inside the tree unless ``--state-file``."""
    result = CliRunner().invoke(main, list(args), obj=tree.paths(tree.sys.parent / "state.json"))
    return result.exit_code, result.output


def test_setup_dry_run(tree: Tree, tmp_path: Path) -> None:
    tree.igb()
    config = tmp_path / "node.yaml"
    config.write_text("pfs: [{pf: eth0, numVfs: 2}]\n")
    code, out = invoke(tree, "setup", "--config", str(config), "--dry-run", "--data-dir", str(tmp_path / "data"))
    assert (code, out) == (
        0,
        "dry run: nothing is changed\neth0 (0000:01:00.0): sriov_numvfs 0 -> 2: would change\n"
        "eth0 (0000:01:00.0): link up: unchanged\neth0 (0000:01:00.0): new VFs opened and closed once: would change\n",
    )


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("pfs: [{pf: eth0, numVfs: 9}]", "pfs[0].numVfs: 9 is more than eth0 supports (sriov_totalvfs 7)"),
        ("pfs: [{pf: eth0, numVfs: two}]", 'pfs[0].numVfs: must be an integer from 0 to 65535, got "two"'),
    ],
)
def test_setup_errors_are_one_line(tree: Tree, tmp_path: Path, yaml_text: str, message: str) -> None:
    tree.igb()
    config = tmp_path / "node.yaml"
    config.write_text(yaml_text)
    code, out = invoke(tree, "setup", "--config", str(config), "--data-dir", str(tmp_path / "data"))
    prefix = f"{config}: " if "got" in message else ""
    assert (code, out) == (1, f"Error: {prefix}{message}\n")


def test_setup_missing_config(tree: Tree, tmp_path: Path) -> None:
    code, out = invoke(tree, "setup", "--config", str(tmp_path / "none.yaml"))
    assert (code, out) == (1, f"Error: cannot read {tmp_path / 'none.yaml'}: No such file or directory\n")


def test_setup_writes_the_state_file_given(tree: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree.igb()
    monkeypatch.setattr(node_setup, "NetlinkLinks", lambda: None)  # nothing to change on the link
    config = tmp_path / "node.yaml"
    config.write_text("pfs: [{pf: eth0, numVfs: 0, tuning: {}}]\n")
    state = tmp_path / "state.json"
    code, out = invoke(
        tree, "setup", "--config", str(config), "--state-file", str(state), "--data-dir", str(tmp_path / "data")
    )
    assert code == 0, out
    assert out.splitlines()[-1] == f"state {state}: written"
    assert json.loads(state.read_text())["pfs"]["0000:01:00.0"]["pins"] == {"31": 0}


def _allocate(
    tmp_path: Path, vf_pci: str, index: int, netns: Path, device_info_file: str = "", pod: tuple[str, str] = ("", "")
) -> None:
    alloc = Allocation(vf_pci, "0000:01:00.0", "eth0", index, "net-a", "0123456789abcdef", "net1", str(netns), None)
    alloc.device_info_file = device_info_file
    alloc.pod_namespace, alloc.pod_name = pod
    FileStore(tmp_path / "data").put(alloc)


@pytest.fixture
def node(tree: Tree, tmp_path: Path, fake_netlink: list[str | None]) -> Tree:
    tree.igb(vfs=3)
    tree.igb("0000:02:00.0", "eth1", total=4)
    alive = tmp_path / "netns-alive"
    alive.write_text("")
    _allocate(
        tmp_path, "0000:01:10.1", 1, alive, "/run/k8s.cni.cncf.io/devinfo/cni/net-a-0123_net1", ("team-a", "trainer-0")
    )
    tree.rdma("0000:01:10.1", "mlx5_1")
    _allocate(tmp_path, "0000:01:10.2", 2, tmp_path / "netns-gone")
    return tree


def test_status_json(node: Tree, tmp_path: Path) -> None:
    code, out = invoke(node, "status", "--json", "--data-dir", str(tmp_path / "data"))
    assert code == 0, out
    pf0, pf1 = json.loads(out)["pfs"]
    assert {k: pf0[k] for k in ("pci", "netdev", "driver", "numVfs", "totalVfs", "mtu", "link", "free")} == {
        "pci": "0000:01:00.0",
        "netdev": "eth0",
        "driver": "igb",
        "numVfs": 3,
        "totalVfs": 7,
        "mtu": 1500,
        "link": "up",
        "free": 1,
    }
    assert pf0["irqs"] == [{"irq": 31, "name": "eth0-TxRx-0", "cpus": "0-7"}]
    assert pf0["irqbalance"] == {"pids": [], "banned": False}
    assert [(v["index"], v["pci"], v["driver"], v["netdev"], v["state"]) for v in pf0["vfs"]] == [
        (0, "0000:01:10.0", "igbvf", "eth0v0", "free"),
        (1, "0000:01:10.1", "igbvf", "eth0v1", "allocated"),
        (2, "0000:01:10.2", "igbvf", "eth0v2", "stale"),
    ]
    assert pf0["vfs"][1]["allocation"] == {
        "network": "net-a",
        "containerID": "0123456789abcdef",
        "pod": "team-a/trainer-0",
        "podUID": None,
        "ifname": "net1",
        "netns": str(tmp_path / "netns-alive"),
        "deviceInfoFile": "/run/k8s.cni.cncf.io/devinfo/cni/net-a-0123_net1",
        "gone": None,
        "unrestored": [],
    }
    assert pf0["vfs"][2]["allocation"]["deviceInfoFile"] is None
    assert pf0["vfs"][2]["allocation"]["gone"] == "netns gone"
    # The facts ADD writes into an attachment's device-info file, in the spec's layout.
    assert [v["deviceInfo"] for v in pf0["vfs"][:2]] == [
        {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:01:10.0", "pf-pci-address": "0000:01:00.0"}},
        {
            "type": "pci",
            "version": "1.1.0",
            "pci": {"pci-address": "0000:01:10.1", "pf-pci-address": "0000:01:00.0", "rdma-device": "mlx5_1"},
        },
    ]
    assert pf0["vfs"][0]["irqs"] == [
        {"irq": 100, "name": "eth0v0-tx-0", "cpus": "0-7"},
        {"irq": 101, "name": "eth0v0-rx-0", "cpus": "0-7"},
    ]
    assert (pf1["netdev"], pf1["numVfs"], pf1["totalVfs"], pf1["vfs"], pf1["free"]) == ("eth1", 0, 4, [], 0)


def test_status_shows_a_vf_free_after_its_allocation_is_removed(node: Tree, tmp_path: Path) -> None:
    FileStore(tmp_path / "data").remove("0000:01:10.1")
    _code, out = invoke(node, "status", "--json", "--data-dir", str(tmp_path / "data"))
    vf1 = json.loads(out)["pfs"][0]["vfs"][1]
    assert (vf1["state"], vf1["allocation"]) == ("free", None)


def test_status_table(node: Tree, tmp_path: Path) -> None:
    code, out = invoke(node, "status", "--data-dir", str(tmp_path / "data"))
    assert code == 0, out
    lines = out.splitlines()
    assert (
        lines[0] == "PF eth0 0000:01:00.0  driver igb  VFs 3/7  MTU 1500  link up  free 1  irqbalance off  IRQs 31:0-7"
    )
    assert lines[1].split() == [
        "VF",
        "PCI",
        "DRIVER",
        "NETDEV",
        "RDMA",
        "STATE",
        "NETWORK",
        "POD",
        "IFNAME",
        "IRQ:CPUS",
    ]
    assert lines[3].split() == [
        "1",
        "0000:01:10.1",
        "igbvf",
        "eth0v1",
        "mlx5_1(host)",
        "allocated",
        "net-a",
        "team-a/trainer-0",
        "net1",
        "103:0-7",
        "104:0-7",
    ]
    # Without a pod name from CNI_ARGS, the container's.
    assert lines[4].split()[4:10] == ["-", "stale", "(netns", "gone)", "net-a", "0123456789ab"]
    # A realistic row stays readable in a terminal.
    assert max(len(line) for line in lines) <= 120
    assert (
        lines[5] == "PF eth1 0000:02:00.0  driver igb  VFs 0/4  MTU 1500  link up  free 0  irqbalance off  IRQs 41:0-7"
    )


def test_status_shows_a_vf_the_daemon_is_giving_back_and_why(node: Tree, tmp_path: Path) -> None:
    store = FileStore(tmp_path / "data")
    stale = store.get("0000:01:10.2")
    assert stale is not None
    stale.giving_back, stale.boot_id = "earlier boot", "an earlier boot"
    store.put(stale)
    _code, out = invoke(node, "status", "--data-dir", str(tmp_path / "data"))
    assert out.splitlines()[4].split()[4:9] == ["-", "giving", "back", "(earlier", "boot)"]
    _code, out = invoke(node, "status", "--json", "--data-dir", str(tmp_path / "data"))
    vf2 = json.loads(out)["pfs"][0]["vfs"][2]
    assert (vf2["state"], vf2["allocation"]["gone"]) == ("giving back", "earlier boot")


def test_status_shows_the_pool_around_a_damaged_record_and_then_fails(node: Tree, tmp_path: Path) -> None:
    (tmp_path / "data" / "vfs" / "0000:01:10.0.json").write_text("{half a record")
    code, out = invoke(node, "status", "--data-dir", str(tmp_path / "data"))
    assert code == 1, out
    lines = out.splitlines()
    assert "unreadable record: state file" in lines[2] and "is unreadable" in lines[2], lines[2]
    assert lines[3].split()[5] == "allocated"
    assert lines[-1] == f"Error: unreadable records of VF 0000:01:10.0 in {tmp_path / 'data'}: see their state above"
    code, out = invoke(node, "status", "--json", "--data-dir", str(tmp_path / "data"))
    assert code == 1
    vf0 = json.loads(out[: out.rindex("}") + 1])["pfs"][0]["vfs"][0]
    assert vf0["state"] == "unreadable record" and "is unreadable" in vf0["recordError"]


def test_status_does_not_create_the_store(node: Tree, tmp_path: Path) -> None:
    code, _out = invoke(node, "status", "--data-dir", str(tmp_path / "nothing-here"))
    assert code == 0 and not (tmp_path / "nothing-here").exists()


def test_bin_script_runs_from_anywhere(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bin" / "sriov-cni"), "--help"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and "setup" in done.stdout and "status" in done.stdout


def test_status_names_each_vfs_rdma_device(node: Tree, tmp_path: Path) -> None:
    """A free mlx5-like VF shows its device from sysfs; an allocated one the device its record says the pod holds."""
    node.rdma("0000:01:10.0", "mlx5_2")
    store = FileStore(tmp_path / "data")
    alloc = store.get("0000:01:10.1")
    assert alloc is not None
    alloc.rdma_device = "rxe_0000_01_10_1"
    alloc.rdma_soft = True
    store.put(alloc)
    _code, out = invoke(node, "status", "--json", "--data-dir", str(tmp_path / "data"))
    vfs = json.loads(out)["pfs"][0]["vfs"]
    assert [v["rdmaDevice"] for v in vfs] == ["mlx5_2", "rxe_0000_01_10_1", None]
    # This host's kernel has no RDMA core: no mode, and no namespace holds the free VF's device.
    assert json.loads(out)["rdmaNetnsMode"] is None
    assert [v["rdmaWhere"] for v in vfs] == ["host", "pod", None]
    _code, table = invoke(node, "status", "--data-dir", str(tmp_path / "data"))
    rows = [line.split() for line in table.splitlines() if line.startswith("  ")]
    assert [row[4] for row in rows[:4]] == ["RDMA", "mlx5_2(host)", "rxe_0000_01_10_1(pod)", "-"]


@pytest.mark.parametrize(
    ("view", "where"),
    [
        # Exclusive: the free VF's device in the host, the allocated one's moved out of it.
        (node_status.RdmaView("exclusive", frozenset({"mlx5_0"})), ["host", "pod", "elsewhere"]),
        # Exclusive, every device still in the host (a move not made yet, or undone).
        (node_status.RdmaView("exclusive", frozenset({"mlx5_0", "mlx5_1", "mlx5_2"})), ["host", "host", "host"]),
        # Shared: nothing moves, every namespace sees each device.
        (node_status.RdmaView("shared", frozenset({"mlx5_0", "mlx5_1", "mlx5_2"})), ["shared", "shared", "shared"]),
    ],
)
def test_status_says_where_each_rdma_device_is(
    node: Tree, tmp_path: Path, view: node_status.RdmaView, where: list[str]
) -> None:
    """Fixture: the kernel's view (mode, devices the host sees), which this host's kernel cannot give.

    The sysfs tree agrees with it: a device the host's namespace does not
    see is missing from its function's infiniband/ and shows only through
    its ib_uverbs entry, as the kernel's namespaced class has it.
    """
    # The fixture's allocated VF 1 has mlx5_1 already.
    for index in (0, 2):
        name = f"mlx5_{index}"
        assert view.host_devices is not None
        node.rdma(f"0000:01:10.{index}", name, uverbs=index + 4, here=name in view.host_devices)
    store = FileStore(tmp_path / "data")
    alloc = store.get("0000:01:10.1")
    assert alloc is not None
    alloc.rdma_device = "mlx5_1"
    store.put(alloc)
    pfs = node_status.gather(node.paths(tmp_path / "state.json"), tmp_path / "data", lambda _name: True, view)
    assert [(v["rdmaDevice"], v["rdmaWhere"]) for v in pfs[0]["vfs"]] == list(
        zip(["mlx5_0", "mlx5_1", "mlx5_2"], where, strict=True)
    )
    assert node_status.table(pfs, view.mode)[0] == f"RDMA netns mode {view.mode}"
    # Wherever a device is, its character device is its function's ib_uverbs entry.
    assert [pfs[0]["vfs"][i]["rdmaUverbsDevice"] for i in (0, 2)] == [
        "/dev/infiniband/uverbs4",
        "/dev/infiniband/uverbs6",
    ]


def test_version_and_short_help() -> None:
    runner = CliRunner()
    version = runner.invoke(main, ["--version"])
    assert (version.exit_code, version.output) == (0, f"sriov-cni {__version__}\n")
    assert runner.invoke(main, ["-V"]).output == version.output
    for args in (["-h"], ["status", "-h"], ["setup", "-h"]):
        shown = runner.invoke(main, args)
        assert shown.exit_code == 0 and shown.output.startswith("Usage: "), (args, shown.output)


def test_setup_says_on_stderr_what_it_waits_for_before_a_long_step(
    tree: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.pf("0000:3b:00.0", None, driver="mlx5_core")
    numvfs = tree.sys / "bus/pci/devices/0000:3b:00.0/sriov_numvfs"

    def create(sys_root: Path, pf: str, count: int, want_netdevs: bool) -> int:
        numvfs.write_text(f"{count}\n")
        return count

    monkeypatch.setattr(node_vfs, "set_numvfs", create)
    config = tmp_path / "node.yaml"
    config.write_text("irqbalance: leave\npfs: [{pf: '0000:3b:00.0', numVfs: 6}]\n")
    result = CliRunner().invoke(
        main,
        ["setup", "--config", str(config), "--data-dir", str(tmp_path / "data")],
        obj=tree.paths(tmp_path / "state.json"),
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == "setup: 0000:3b:00.0: creating 6 VFs (mlx5 may take up to two minutes)\n"
    assert result.stdout.splitlines()[0] == "0000:3b:00.0 (0000:3b:00.0): sriov_numvfs 0 -> 6: done"
