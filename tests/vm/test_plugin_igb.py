"""The ``sriov`` plugin on the real igb/igbvf driver (runs in the rig's QEMU guest).

Nothing is faked: the plugin runs with its default dependencies (the kernel
VF control through the PF's netdev, the file store).  Effects are read back
with ``ip -j`` (the PF's ``vfinfo_list``, links and addresses in the pods).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.daemon import install
from tests.support.daemonlib import Daemon
from tests.vm.plugincalls import cni, env, host_link, ns_path, records, restored, vfinfo, view
from tests.vm.vmlib import Sriov, ip_json, vf_pci_dirs, wait_until

pytestmark = pytest.mark.sriov_vm

REPO = Path(__file__).resolve().parents[2]


def conf_for(data_dir: Path, pf: str, version: str = "1.1.0", **keys: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "igbnet", "type": "sriov", "pfNames": [pf], "dataDir": str(data_dir), **keys}


def test_every_setting_applied_and_restored(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    pf = igb_pfs[0]
    [vf0, _] = sriov.enable(pf, 2)
    info_before = vfinfo(pf, 0)
    netdev_before = view(host_link(vf0))
    pod = netns()
    mac = "02:00:00:5a:0a:01"
    conf = conf_for(tmp_path, pf, mac=mac, vlan=100, vlanQoS=3, spoofchk="off", trust="on", max_tx_rate=100)

    rc, res = cni("ADD", conf, netns=ns_path(pod))

    assert rc == 0, res
    assert res["interfaces"] == [
        {"name": "net1", "mac": mac, "mtu": 1500, "sandbox": ns_path(pod), "pciID": vf_pci_dirs(pf)[0].name}
    ]
    info = vfinfo(pf, 0)
    assert info["address"] == mac
    assert info["vlan_list"] == [{"vlan": 100, "qos": 3}]
    assert info["spoofchk"] is False
    assert info["trust"] is True
    assert info["rate"] == {"max_tx": 100, "min_tx": 0}
    inside = host_link("net1", pod)
    assert inside is not None and inside["address"] == mac and "UP" in inside["flags"]
    assert host_link(vf0) is None
    assert vfinfo(pf, 1)["vlan_list"] == [{}]  # the other VF untouched

    rc, res = cni("DEL", conf, netns=ns_path(pod))

    assert rc == 0, res
    assert netdev_before is not None
    restored(vfinfo(pf, 0), info_before)
    assert view(host_link(vf0)) == netdev_before
    assert host_link("net1", pod) is None
    assert records(tmp_path) == []
    # The admin MAC is really gone: igb lets the VF choose its own MAC again
    # (while one is set it refuses the VF's request).
    subprocess.run(["ip", "link", "set", "dev", vf0, "address", "02:00:00:5a:0a:99"], check=True)
    assert view(host_link(vf0))["address"] == "02:00:00:5a:0a:99"  # type: ignore[index]


def test_link_state_refused_by_igb_rolls_back(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    pf = igb_pfs[0]
    [vf0] = sriov.enable(pf, 1)
    info_before = vfinfo(pf, 0)
    netdev_before = view(host_link(vf0))
    pod = netns()
    conf = conf_for(tmp_path, pf, mac="02:00:00:5a:0b:01", vlan=7, spoofchk="off", trust="on", link_state="disable")

    rc, res = cni("ADD", conf, netns=ns_path(pod))

    assert rc == 1
    assert res["code"] == 100 and "link_state" in res["msg"], res
    assert netdev_before is not None
    restored(vfinfo(pf, 0), info_before)
    assert view(host_link(vf0)) == netdev_before
    assert [str(x["ifname"]) for x in ip_json("link", "show", netns=pod)] == ["lo"]
    assert records(tmp_path) == []


def test_parallel_adds_exhaustion_and_status(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    pf = igb_pfs[1]
    vfs = sriov.enable(pf, 7)
    before = {i: vfinfo(pf, i) for i in range(7)}
    pods = [netns() for _ in range(8)]
    conf = conf_for(tmp_path, pf, vlan=33)
    stdin = json.dumps(conf).encode()

    # Seven runtimes at once, each its own sriov process, served by the warm
    # daemon as on a node (each starting the plugin cold would spend the
    # test's time importing under emulation, not racing for VFs).
    bindir = tmp_path / "bin"
    install.install(str(bindir))
    daemon = Daemon(tmp_path / "run")
    try:
        procs = [
            subprocess.Popen(
                [str(bindir / "sriov")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env("ADD", container=f"par{i}", netns=ns_path(pods[i])), SRIOV_CNI_SOCKET=str(daemon.socket)),
            )
            for i in range(7)
        ]
        # Each caller fed and read in a thread of its own: the daemon gives a
        # call the request timeout to end its stdin, and a stdin written only
        # once the call before it answered would wait on that call.
        with ThreadPoolExecutor(len(procs)) as callers:
            outs = list(callers.map(lambda p: p.communicate(stdin, timeout=240), procs))
    finally:
        daemon.stop()
    assert [p.returncode for p in procs] == [0] * 7, [o[0] for o in outs]
    taken = [json.loads(o[0])["interfaces"][0]["pciID"] for o in outs]
    assert sorted(taken) == sorted(d.name for d in vf_pci_dirs(pf))
    assert len(records(tmp_path)) == 7
    assert all(vfinfo(pf, i)["vlan_list"] == [{"vlan": 33}] for i in range(7))
    assert not {v for v in vfs} & {str(x["ifname"]) for x in ip_json("link", "show")}

    rc, res = cni("ADD", conf, container="late", netns=ns_path(pods[7]))
    assert rc == 1 and res["code"] == 101, res
    assert "no free VF" in res["msg"]
    rc, res = cni("STATUS", conf)
    assert rc == 1 and res["code"] == 50, res
    assert "no free VF" in res["msg"]

    for i in range(7):
        rc, res = cni("DEL", conf, container=f"par{i}", netns=ns_path(pods[i]))
        assert rc == 0, res
    for i, name in enumerate(vfs):
        link = host_link(name)
        assert link is not None
        restored(vfinfo(pf, i), before[i])
    assert set(vfs) <= {str(x["ifname"]) for x in ip_json("link", "show")}
    assert records(tmp_path) == []
    assert cni("STATUS", conf) == (0, None)


def test_pod_netns_deleted_before_del(igb_pfs: list[str], sriov: Sriov, tmp_path: Path) -> None:
    pf = igb_pfs[0]
    [vf0] = sriov.enable(pf, 1)
    info_before = vfinfo(pf, 0)
    netdev_before = view(host_link(vf0))
    pod = f"vmtest-gone-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", pod], check=True)
    conf = conf_for(tmp_path, pf, mac="02:00:00:5a:0c:01", vlan=20, trust="on")
    rc, res = cni("ADD", conf, netns=ns_path(pod), ifname="podnet0")
    assert rc == 0, res

    subprocess.run(["ip", "netns", "delete", pod], check=True)

    # The kernel hands the physical netdev back to the host under its pod
    # name, from its namespace cleanup work: later, on a busy node.
    wait_until(lambda: host_link("podnet0") is not None, 60, "the VF back from the deleted namespace")
    returned = host_link("podnet0")
    assert returned is not None and returned["address"] == "02:00:00:5a:0c:01"
    assert host_link(vf0) is None
    rc, res = cni("DEL", conf, netns=ns_path(pod), ifname="podnet0")
    assert rc == 0, res
    assert host_link("podnet0") is None
    assert view(host_link(vf0)) == netdev_before
    assert netdev_before is not None
    restored(vfinfo(pf, 0), info_before)
    assert records(tmp_path) == []


def test_two_pods_on_one_pf_ping(igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path) -> None:
    # sriov-ipam runs in-process; host-local's delegation is covered on the host
    # (tests/plugin), and each extra ADD costs seconds under TCG.
    ipam_type = "sriov-ipam"
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    pods = [netns(), netns()]
    ipam = {"type": ipam_type, "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "10.79.0.0/24"}]]}
    conf = conf_for(tmp_path, pf, "1.0.0", ipam=ipam)
    for i, pod in enumerate(pods):
        rc, res = cni("ADD", conf, container=f"ping{i}", netns=ns_path(pod))
        assert rc == 0, res
        assert res["ips"][0]["address"] == f"10.79.0.{i + 2}/24"
    for pod in pods:
        sriov.wait_carrier("net1", pod)

    ping = subprocess.run(
        ["ip", "netns", "exec", pods[0], "ping", "-c", "3", "-i", "0.2", "-W", "5", "10.79.0.3"],
        capture_output=True,
        text=True,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert " 0% packet loss" in ping.stdout

    for i, pod in enumerate(pods):
        rc, res = cni("DEL", conf, container=f"ping{i}", netns=ns_path(pod))
        assert rc == 0, res
    assert records(tmp_path) == []
    assert not [p for p in os.listdir(tmp_path / "ipam" / "igbnet") if p.startswith("10.")]
