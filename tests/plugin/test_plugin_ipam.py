"""IPAM through the plugin: Debian's host-local executed from CNI_PATH, and sriov-ipam in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import hangipam
from tests.support.pluginlib import SRIOV_BIN, Node, addresses, ipam_reservations, link_names, routes


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
@pytest.mark.parametrize("kind", ["host-local", "sriov-ipam"])
def test_address_and_routes_in_the_pod_then_released(node: Node, version: str, kind: str) -> None:
    node.add_pf(1)
    pod = node.pod()
    ns = os.path.basename(pod)
    before = node.picture()
    make = node.host_local if kind == "host-local" else node.sriov_ipam
    ipam = make("10.47.0.0/24")
    ipam["routes"] = [{"dst": "0.0.0.0/0"}, {"dst": "172.30.0.0/16", "gw": "10.47.0.254"}]
    conf = node.conf(version, ipam=ipam)

    res = node.add(conf, netns=pod)

    ip = {"address": "10.47.0.2/24", "gateway": "10.47.0.1", "interface": 0}
    if version != "1.0.0":
        ip["version"] = "4"
    assert res.out["ips"] == [ip]
    assert res.out["routes"] == [{"dst": "0.0.0.0/0"}, {"dst": "172.30.0.0/16", "gw": "10.47.0.254"}]
    assert addresses("net1", ns) == {"10.47.0.2/24"}
    table = {(r["dst"], r.get("gateway"), r["dev"]) for r in routes(ns)}
    # A route without gw goes via the range's gateway, as CNI's ConfigureIface does.
    assert {
        ("default", "10.47.0.1", "net1"),
        ("172.30.0.0/16", "10.47.0.254", "net1"),
        ("10.47.0.0/24", None, "net1"),
    } == table
    assert ipam_reservations(node.ipam_dir, "sriov-net") == {"10.47.0.2"}

    assert node.cni("DEL", conf, netns=pod).rc == 0

    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()
    assert node.picture() == before


def test_sriov_ipam_with_cni_1_1_0(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    conf = node.conf("1.1.0", ipam=node.sriov_ipam("fd00:47::/64"))
    res = node.add(conf, netns=pod)
    assert res.out["ips"] == [{"address": "fd00:47::2/64", "gateway": "fd00:47::1", "interface": 0}]
    assert addresses("net1", os.path.basename(pod)) == {"fd00:47::2/64"}
    assert node.cni("DEL", conf, netns=pod).rc == 0
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_debian_host_local_refuses_1_1_0_cleanly(node: Node) -> None:
    # Debian's host-local is built with libcni 1.1.2, which knows spec 1.0.0 at most.
    node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    res = node.cni("ADD", node.conf("1.1.0", ipam=node.host_local()), netns=pod)
    assert res.rc != 0
    assert res.code == 1
    assert "host-local" in res.out["msg"]
    assert node.picture() == before
    assert link_names(os.path.basename(pod)) == {"lo"}
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_a_delegated_ipam_plugin_dies_with_the_plugin(tmp_path: Path) -> None:
    # A runtime that gives up on a call kills the plugin and nothing else.
    # Left running, a hung IPAM DEL would finish after the runtime's retry
    # and release the address of the pod ADDed again meanwhile.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pid_file = tmp_path / "ipam.pid"
    conf = json.dumps(
        {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "ipam": {"type": hangipam.install(bin_dir, pid_file)}}
    )
    env = {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": "c1",
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bin_dir),
        "CNI_NETNS": str(tmp_path / "gone"),
        "SRIOV_CNI_SOCKET": str(tmp_path / "no-daemon.sock"),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    plugin = subprocess.Popen([str(SRIOV_BIN)], stdin=subprocess.PIPE, env=env)
    assert plugin.stdin is not None
    plugin.stdin.write(conf.encode())
    plugin.stdin.close()
    ipam = hangipam.started(pid_file)
    assert not hangipam.ended(ipam)
    plugin.kill()
    plugin.wait(timeout=60)
    for _ in range(600):
        if hangipam.ended(ipam):
            break
        time.sleep(0.05)
    else:
        os.kill(ipam, signal.SIGKILL)
        raise AssertionError("the IPAM plugin outlived the plugin that ran it")
