"""Sharing one pool with Debian's host-local binary, in both directions."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from sriov_cni.cni import Code
from sriov_cni.ipam.store import DiskStore
from tests.ipam.ipamtypes import Invoke, MakeConf, Stored

DUAL = [[{"subnet": "10.8.0.0/28"}], [{"subnet": "fd08::/64"}]]


def test_neither_tool_hands_out_the_others_addresses(
    cni: Invoke, host_local: Invoke, netconf: MakeConf, stored: Stored
) -> None:
    conf = netconf(DUAL)
    theirs = [host_local("ADD", conf, cid=f"h{i}").addresses() for i in range(3)]
    ours = [cni("ADD", conf, cid=f"s{i}").addresses() for i in range(3)]
    theirs += [host_local("ADD", conf, cid=f"h{i}").addresses() for i in range(3, 6)]
    flat = [ip for pair in theirs + ours for ip in pair]
    assert len(set(flat)) == len(flat) == 18
    # Both follow the same last_reserved_ip round robin.
    assert [pair[0] for pair in ours] == ["10.8.0.5/28", "10.8.0.6/28", "10.8.0.7/28"]
    assert [pair[0] for pair in theirs[3:]] == ["10.8.0.8/28", "10.8.0.9/28", "10.8.0.10/28"]
    owners = sorted(set(stored().values()))
    assert owners == sorted([f"h{i}\r\neth0" for i in range(6)] + [f"s{i}\r\neth0" for i in range(3)])


def test_each_tool_releases_and_checks_the_others_reservations(
    cni: Invoke, host_local: Invoke, netconf: MakeConf, stored: Stored
) -> None:
    conf = netconf(DUAL, version="0.4.0")
    cni("ADD", conf, cid="ours")
    host_local("ADD", conf, cid="theirs")
    assert host_local("CHECK", conf, cid="ours").rc == 0
    assert cni("CHECK", conf, cid="theirs").rc == 0
    assert host_local("DEL", conf, cid="ours").rc == 0
    assert sorted(stored().values()) == ["theirs\r\neth0"] * 2
    assert cni("DEL", conf, cid="theirs").rc == 0
    assert stored() == {}
    # After host-local released it, our hint for "ours" is stale: CHECK
    # must not believe it.
    assert cni("CHECK", conf, cid="ours").code == Code.IPAM


def test_an_address_host_local_reissued_is_not_ours_any_more(
    cni: Invoke, host_local: Invoke, netconf: MakeConf, net_dir: Path
) -> None:
    conf = netconf([[{"subnet": "10.8.0.0/29"}]])
    first = cni("ADD", conf, cid="a").addresses()
    host_local("DEL", conf, cid="a")
    (net_dir / "last_reserved_ip.0").write_text("10.8.0.1")
    assert host_local("ADD", conf, cid="b").addresses() == first
    # a's repeated ADD must get a new address, and a's DEL must leave b's alone.
    assert cni("ADD", conf, cid="a").addresses() != first
    assert cni("DEL", conf, cid="a").rc == 0
    assert (net_dir / first[0].split("/")[0]).read_bytes() == b"b\r\neth0"


def blocked_on(pid: int, inode: int) -> bool:
    """Whether ``pid`` waits for a lock on ``inode``: /proc/locks marks a waiter's line with "->"."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "->" and fields[5] == str(pid) and fields[6].endswith(f":{inode}"):
            return True
    return False


def test_host_local_waits_for_our_lock(netconf: MakeConf, net_dir: Path, data_dir: Path) -> None:
    conf = netconf([[{"subnet": "10.8.0.0/29"}]])
    conf["ipam"]["type"] = "host-local"
    env = {
        **os.environ,
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "h",
        "CNI_NETNS": "/var/run/netns/test",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
    }
    s = DiskStore(str(data_dir), "testnet")
    with s.locked():
        proc = subprocess.Popen(["/usr/lib/cni/host-local"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        # Once host-local waits on the lock (the kernel lists it as blocked
        # on the lock file), not after a fixed time that a loaded machine
        # may spend before host-local even reaches it.
        inode = os.stat(net_dir / "lock").st_ino
        deadline = time.monotonic() + 120
        while not blocked_on(proc.pid, inode):
            assert proc.poll() is None, "host-local ran while we held the lock"
            assert time.monotonic() < deadline, "host-local never waited for the lock"
            time.sleep(0.05)
        assert not (net_dir / "10.8.0.2").exists()
    with proc.stdout:
        out = json.loads(proc.stdout.read())
    assert proc.wait(timeout=30) == 0
    assert out["ips"][0]["address"] == "10.8.0.2/29"
    assert Path(net_dir / "10.8.0.2").read_bytes() == b"h\r\neth0"


@pytest.mark.parametrize("version", [None, "", "0.1.0", "0.2.0"], ids=["missing", "empty", "0.1.0", "0.2.0"])
def test_old_versions_are_answered_as_host_local_answers_them(
    exe: Invoke, host_local: Invoke, netconf: MakeConf, stored: Stored, version: str | None
) -> None:
    # skel reads a missing or empty cniVersion as 0.1.0; results before
    # 0.3.0 carry one address per family as ip4/ip6.
    conf = netconf(DUAL, routes=[{"dst": "0.0.0.0/0"}, {"dst": "fd09::/64"}])
    if version is None:
        del conf["cniVersion"]
    else:
        conf["cniVersion"] = version
    theirs = host_local("ADD", conf, cid="theirs")
    ours = exe("ADD", conf, cid="ours")
    assert theirs.rc == 0 and ours.rc == 0, (theirs.out, ours.out)
    assert ours.out == {
        "cniVersion": version or "0.1.0",
        "ip4": {"ip": "10.8.0.3/28", "gateway": "10.8.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
        "ip6": {"ip": "fd08::3/64", "gateway": "fd08::1", "routes": [{"dst": "fd09::/64"}]},
    }
    # host-local's answer has the same shape (its dns is always there, empty).
    assert theirs.out is not None
    assert {k: v for k, v in theirs.out.items() if k != "dns"} == {
        **ours.out,
        "ip4": {**ours.out["ip4"], "ip": "10.8.0.2/28"},
        "ip6": {**ours.out["ip6"], "ip": "fd08::2/64"},
    }
    # And DEL of such a config works, for each tool's reservation.
    assert exe("DEL", conf, cid="theirs").rc == 0
    assert host_local("DEL", conf, cid="ours").rc == 0
    assert stored() == {}
