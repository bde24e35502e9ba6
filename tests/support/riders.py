"""What a pod can build on its VF, as the ``ip`` commands a pod runs, for the DEL tests on both kernels.

Each :class:`Rider` makes, inside the pod's namespace, devices that depend
on the pod's interface ``net1``: upper devices stacked on it (vlan,
macvlan, ...), tunnels bound to it as their output device, or a master it
becomes a port of.  ``made`` names the devices that must be gone after DEL;
``master`` the one that stays, with the VF no longer its port.  The host's
kernel has only the kinds in :data:`HOST_KINDS`; the guest's Debian 6.1 has
all in :data:`GUEST_KINDS` (tests/vm/rig.py loads their modules).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.pluginlib import Node, link


@dataclass(frozen=True)
class Rider:
    kind: str
    commands: tuple[tuple[str, ...], ...]
    made: tuple[str, ...] = ()
    master: str = ""


RIDERS = {
    r.kind: r
    for r in (
        Rider("vlan", (("link", "add", "link", "net1", "name", "net1.10", "type", "vlan", "id", "10"),), ("net1.10",)),
        Rider(
            "qinq",
            (
                ("link", "add", "link", "net1", "name", "svl", "type", "vlan", "proto", "802.1ad", "id", "20"),
                ("link", "add", "link", "svl", "name", "svl.30", "type", "vlan", "id", "30"),
            ),
            ("svl", "svl.30"),
        ),
        Rider(
            "macvlan", (("link", "add", "link", "net1", "name", "mv0", "type", "macvlan", "mode", "bridge"),), ("mv0",)
        ),
        Rider("macvtap", (("link", "add", "link", "net1", "name", "mvt0", "type", "macvtap"),), ("mvt0",)),
        Rider("ipvlan", (("link", "add", "link", "net1", "name", "ipv0", "type", "ipvlan", "mode", "l2"),), ("ipv0",)),
        Rider("ipvtap", (("link", "add", "link", "net1", "name", "ipvt0", "type", "ipvtap"),), ("ipvt0",)),
        Rider("macsec", (("link", "add", "link", "net1", "name", "ms0", "type", "macsec"),), ("ms0",)),
        Rider(
            "vxlan",
            (("link", "add", "vx0", "type", "vxlan", "id", "42", "dev", "net1", "dstport", "4789"),),
            ("vx0",),
        ),
        Rider(
            "gre",
            (("link", "add", "gre1", "type", "gre", "local", "10.9.9.1", "remote", "10.9.9.2", "dev", "net1"),),
            ("gre1",),
        ),
        Rider(
            "ipip",
            (("link", "add", "ipip1", "type", "ipip", "local", "10.9.9.1", "remote", "10.9.9.3", "dev", "net1"),),
            ("ipip1",),
        ),
        Rider(
            "sit",
            (("link", "add", "sit1", "type", "sit", "local", "10.9.9.1", "remote", "10.9.9.4", "dev", "net1"),),
            ("sit1",),
        ),
        Rider(
            "ip6tnl",
            (("link", "add", "ip6t1", "type", "ip6tnl", "local", "fd00::1", "remote", "fd00::2", "dev", "net1"),),
            ("ip6t1",),
        ),
        Rider(
            "hsr",
            (
                ("link", "add", "hsrb", "type", "veth", "peer", "name", "hsrc"),
                ("link", "add", "hsr0", "type", "hsr", "slave1", "net1", "slave2", "hsrb"),
            ),
            ("hsr0",),
        ),
        # Riders of riders: a VXLAN bound to a VLAN on a macvlan on the VF.
        Rider(
            "stacked",
            (
                ("link", "add", "link", "net1", "name", "mvs", "type", "macvlan"),
                ("link", "add", "vxs", "type", "vxlan", "id", "43", "dev", "mvs", "dstport", "4790"),
                ("link", "add", "brs", "type", "bridge"),
                ("link", "set", "dev", "vxs", "master", "brs"),
            ),
            ("mvs", "vxs"),
        ),
        Rider(
            "bridge", (("link", "add", "br0", "type", "bridge"), ("link", "set", "net1", "master", "br0")), (), "br0"
        ),
        Rider(
            "bond",
            (
                ("link", "add", "bond0", "type", "bond", "mode", "active-backup"),
                ("link", "set", "net1", "down"),
                ("link", "set", "net1", "master", "bond0"),
            ),
            (),
            "bond0",
        ),
        Rider(
            "team",
            (
                ("link", "add", "team0", "type", "team"),
                ("link", "set", "net1", "down"),
                ("link", "set", "net1", "master", "team0"),
            ),
            (),
            "team0",
        ),
        Rider(
            "vrf",
            (("link", "add", "vrf0", "type", "vrf", "table", "10"), ("link", "set", "net1", "master", "vrf0")),
            (),
            "vrf0",
        ),
    )
}
HOST_KINDS = ("macvlan", "macvtap", "vxlan", "bridge")
# Debian's 6.1 has no HSR module; its 7.x kernels have one (tests/vm/rig.py
# loads it there).
GUEST_KINDS = tuple(kind for kind in RIDERS if kind != "hsr" or Path("/sys/module/hsr").is_dir())


def ip(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "-n", netns, *args], capture_output=True, text=True, check=False)


def links(netns: str) -> dict[str, dict[str, Any]]:
    """``ip -j -d link`` in ``netns``, by name."""
    out = ip(netns, "-j", "-d", "link", "show")
    assert out.returncode == 0, out.stderr
    return {entry["ifname"]: entry for entry in json.loads(out.stdout)}


def build(netns: str, rider: Rider) -> None:
    """Make ``rider`` in the pod and check with iproute2 that it depends on ``net1``."""
    for command in rider.commands:
        out = ip(netns, *command)
        assert out.returncode == 0, f"{' '.join(command)}: {out.stderr}"
    seen = links(netns)
    for name in rider.made:
        assert name in seen, f"{name} was not made"
    if rider.master:
        assert seen["net1"].get("master") == rider.master, seen["net1"]
    else:
        # The first device made names net1 as its link (VXLAN in its data,
        # HSR as a port).
        first = seen[rider.made[0]]
        data = first.get("linkinfo", {}).get("info_data", {})
        assert "net1" in (first.get("link"), data.get("link"), data.get("slave1")), first


def left_on(netns: str, rider: Rider) -> list[str]:
    """What of ``rider`` still refers to the VF's pod interface after DEL: its devices, or a port in its master."""
    seen = links(netns)
    left = [name for name in rider.made if name in seen]
    if rider.master:
        assert rider.master in seen, f"the pod's own {rider.master} went too"
        left += [name for name, entry in seen.items() if entry.get("master") == rider.master]
    return left


def del_leaves_nothing_of(node: Node, kind: str) -> None:
    """A pod builds ``kind`` on its VF (veths as VFs, ``node``'s): CHECK names it, DEL removes it, the VF goes home."""
    vf = node.add_pf(1).vfs[0]
    assert vf.netdev
    pod = node.pod()
    ns = os.path.basename(pod)
    conf = node.conf()
    res = node.add(conf, netns=pod, ifname="net1")
    rider = RIDERS[kind]
    build(ns, rider)

    check = node.cni("CHECK", dict(conf, prevResult=res.out), netns=pod, ifname="net1")
    assert check.rc != 0, check.stdout
    named = rider.made[0] if rider.made else rider.master
    assert named in check.out["details"] and "DEL" in check.out["details"], check.out

    assert node.cni("DEL", conf, netns=pod, ifname="net1").rc == 0
    assert left_on(ns, rider) == []
    assert link(vf.netdev) is not None
    assert node.records() == []
