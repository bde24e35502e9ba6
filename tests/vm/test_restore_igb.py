"""A pod changes all it can on its igbvf VF; DEL gives it back as before ADD (runs in the rig's QEMU guest).

Real: igb/igbvf, the plugin in process, ip, ethtool and tc.  The oracle is
``ip -j -d link`` and ethtool's own readings of the VF netdev before ADD and
after DEL; then a next pod on the same VF, named as the first pod's altname,
has traffic to a pod on the other VF.  What igbvf refuses is asserted as
refused, so a driver that starts taking it shows here.  The guest's kernel
has no clsact qdisc module; the move's reset of qdiscs is tested on the
host (tests/plugin/test_restore.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.vm.plugincalls import Pod, cni, conf, ns_path, ping, records, restored, vfinfo
from tests.vm.vmlib import Sriov

pytestmark = pytest.mark.sriov_vm

VIEW = (
    "ifname", "address", "mtu", "flags", "promiscuity", "allmulti", "txqlen", "group", "ifalias", "altnames",
    "gso_max_size", "gso_max_segs", "gro_max_size", "xdp",
)  # fmt: skip
POD_LINK_CHANGES = (
    "mtu", "1400", "promisc", "on", "allmulticast", "on", "multicast", "off", "arp", "off", "txqueuelen", "77",
    "group", "5", "alias", "the pod's", "gso_max_size", "32000", "gso_max_segs", "100", "gro_max_size", "32000",
    "address", "02:ab:00:00:00:99",
)  # fmt: skip
# ethtool's changes a pod may try, and whether igbvf (Linux 6.1) takes them.
ETHTOOL_CHANGES = {
    ("-K", "net1", "tso", "off", "rx-checksumming", "off"): True,
    ("-G", "net1", "rx", "512", "tx", "512"): True,
    ("-C", "net1", "rx-usecs", "100"): True,
    ("-L", "net1", "combined", "1"): False,
    # igbvf has no pause settings to report, yet ethtool exits 0 here; the
    # readings compared after DEL include -a's.
    ("-A", "net1", "rx", "off"): True,
    ("--set-priv-flags", "net1", "legacy-rx", "on"): False,
    ("--set-fec", "net1", "encoding", "off"): False,
}
ETHTOOL_READINGS = ("-k", "-g", "-c", "-l", "-a", "--show-priv-flags", "--show-fec")


def run(*cmd: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, *cmd], capture_output=True, text=True, check=False)


def view(name: str, netns: str | None = None) -> dict[str, Any]:
    out = run("ip", "-j", "-d", "link", "show", "dev", name, netns=netns)
    assert out.returncode == 0, out.stderr
    [entry] = json.loads(out.stdout)
    found = {key: entry.get(key) for key in VIEW}
    found["flags"] = sorted(set(entry["flags"]) - {"LOWER_UP", "M-DOWN", "NO-CARRIER"})
    found["altnames"] = sorted(entry.get("altnames", []))
    return found


def ethtool(name: str, netns: str | None = None) -> dict[str, str]:
    """Each of ethtool's readings of ``name`` (its text; a refusal reads as its message)."""
    return {opt: (r.stdout + r.stderr) for opt in ETHTOOL_READINGS if (r := run("ethtool", opt, name, netns=netns))}


def test_del_gives_the_vf_back_as_before_whatever_the_pod_did(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], xdp_pass: str, tmp_path: Path
) -> None:
    pf = igb_pfs[0]
    vf0, _ = sriov.enable(pf, 2)
    before, pf_before, eth_before = view(vf0), vfinfo(pf, 0), ethtool(vf0)
    cfg = conf(tmp_path, pf, None, Pod(None, None))
    pod, peer = netns(), netns()
    rc, res = cni("ADD", cfg, container="changer", netns=ns_path(pod))
    assert rc == 0, res
    rc, peer_res = cni("ADD", cfg, container="peer", netns=ns_path(peer))
    assert rc == 0, peer_res

    # The pod, holding NET_ADMIN over its VF, changes all it can.
    assert run("ip", "link", "property", "add", "dev", "net1", "altname", "podalt", netns=pod).returncode == 0
    out = run("ip", "link", "set", "dev", "net1", *POD_LINK_CHANGES, netns=pod)
    assert out.returncode == 0, out.stderr
    out = run("ip", "link", "set", "dev", "net1", "xdpgeneric", "pinned", xdp_pass, netns=pod)
    assert out.returncode == 0, out.stderr
    taken = {args: run("ethtool", *args, netns=pod).returncode == 0 for args in ETHTOOL_CHANGES}
    assert taken == ETHTOOL_CHANGES
    changed = view("net1", pod)
    assert changed["mtu"] == 1400 and changed["txqlen"] == 77 and changed["xdp"] and changed["group"] == "5"
    assert changed["address"] == "02:ab:00:00:00:99" and changed["gro_max_size"] == 32000

    rc, out = cni("DEL", cfg, container="changer", netns=ns_path(pod))
    assert rc == 0, out

    assert view(vf0) == before
    assert ethtool(vf0) == eth_before
    restored(vfinfo(pf, 0), pf_before)

    # The next pod on the same VF, named as the first pod's altname.
    nxt = netns()
    rc, res = cni("ADD", cfg, container="next", netns=ns_path(nxt), ifname="podalt")
    assert rc == 0, res
    assert view("podalt", nxt)["flags"] == sorted({"BROADCAST", "MULTICAST", "UP"})
    sriov.wait_carrier("podalt", nxt)
    sriov.wait_carrier("net1", peer)
    ping(peer, res["ips"][0]["address"].split("/")[0])
    for container, ns, ifname in (("next", nxt, "podalt"), ("peer", peer, "net1")):
        rc, out = cni("DEL", cfg, container=container, netns=ns_path(ns), ifname=ifname)
        assert rc == 0, out
    assert view(vf0) == before
    assert records(tmp_path) == []
