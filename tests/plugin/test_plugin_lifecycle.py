"""ADD and DEL of a kernel VF, per cniVersion: moved, named, up, result shape, given back exactly."""

from __future__ import annotations

import os
from typing import Any

import pytest

from sriov_cni.vfstore import FileStore
from tests.support.fakes import ZERO_MAC
from tests.support.pluginlib import Node, addresses, altname, ipam_reservations, link, link_names, netdev_view, sh

VERSIONS = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_add_del_cycle(node: Node, version: str) -> None:
    pf = node.add_pf(2)
    vf = pf.vfs[0]
    assert vf.netdev
    # Non-default netdev state that DEL must put back.
    sh("ip", "link", "set", "dev", vf.netdev, "mtu", "1400", "promisc", "on", "alias", f"vf0 of {pf.name}")
    pod = node.pod()
    before = node.picture()
    original = link(vf.netdev)
    assert original is not None
    conf = node.conf(version, ipam=node.sriov_ipam("10.40.0.0/24"))

    res = node.add(conf, netns=pod, ifname="net1")

    ns = os.path.basename(pod)
    assert vf.netdev not in link_names()
    inside = link("net1", ns)
    assert inside is not None
    assert inside["address"] == original["address"]  # the same device, by its MAC
    assert "UP" in inside["flags"]
    assert inside["mtu"] == 1400
    # The host's altnames stay out of the pod (they could clash there).
    assert original["altnames"] == [altname(vf.netdev)] and "altnames" not in inside
    iface = {"name": "net1", "mac": original["address"], "sandbox": pod}
    if version == "1.1.0":
        iface.update(mtu=1400, pciID=vf.pci)
    ip = {"address": "10.40.0.2/24", "gateway": "10.40.0.1", "interface": 0}
    if version in ("0.3.1", "0.4.0"):
        ip["version"] = "4"
    assert res.out == {"cniVersion": version, "interfaces": [iface], "ips": [ip]}
    assert addresses("net1", ns) == {"10.40.0.2/24"}
    assert ipam_reservations(node.ipam_dir, "sriov-net") == {"10.40.0.2"}
    assert node.records() == [f"{vf.pci}.json"]

    gone = node.cni("DEL", conf, netns=pod, ifname="net1")

    assert gone.rc == 0, gone.stdout
    assert gone.stdout == ""
    assert link_names(ns) == {"lo"}
    back = link(vf.netdev)
    assert back is not None
    assert netdev_view(back) == netdev_view(original)
    assert node.picture() == before
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


SETTINGS = [
    # (config keys, fake state after ADD, expected set calls in order of application)
    (
        {"vlan": 100, "vlanQoS": 3, "vlanProto": "802.1q"},
        {"vlan": 100, "qos": 3, "vlan_proto": 0x8100},
        [("vlan", (100, 3, 0x8100))],
    ),
    (
        {"vlan": 200, "vlanProto": "802.1ad"},
        {"vlan": 200, "qos": 0, "vlan_proto": 0x88A8},
        [("vlan", (200, 0, 0x88A8))],
    ),
    ({"spoofchk": "off"}, {"spoofchk": False}, [("spoofchk", False)]),
    ({"trust": "on"}, {"trust": True}, [("trust", True)]),
    ({"link_state": "disable"}, {"link_state": 2}, [("link_state", 2)]),
    ({"link_state": "enable"}, {"link_state": 1}, [("link_state", 1)]),
    ({"min_tx_rate": 10, "max_tx_rate": 100}, {"min_tx_rate": 10, "max_tx_rate": 100}, [("rate", (10, 100))]),
    # One limit alone sends the other as 0 (no limit), as the reference
    # does; DEL still restores the VF's original pair (5, 500).
    ({"max_tx_rate": 300}, {"min_tx_rate": 0, "max_tx_rate": 300}, [("rate", (0, 300))]),
    ({"min_tx_rate": 20}, {"min_tx_rate": 20, "max_tx_rate": 0}, [("rate", (20, 0))]),
]


@pytest.mark.parametrize("keys,after,calls", SETTINGS, ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_pf_setting_applied_and_restored(
    node: Node, keys: dict[str, Any], after: dict[str, Any], calls: list[tuple[str, object]]
) -> None:
    pf = node.add_pf(1)
    node.fake.state[pf.name][0].update(min_tx_rate=5, max_tx_rate=500)
    pod = node.pod()
    before = node.picture()
    original = dict(node.fake.state[pf.name][0])

    node.add(node.conf(**keys), netns=pod)

    assert node.fake.state[pf.name][0] == {**original, **after}
    assert [(c[0], c[3]) for c in node.fake.calls] == calls
    assert all(c[1:3] == (pf.name, 0) for c in node.fake.calls)
    node.fake.calls.clear()

    assert node.cni("DEL", node.conf(**keys), netns=pod).rc == 0

    assert node.picture() == before
    restored = {
        "vlan": ("vlan", (0, 0, 0x8100)),
        "spoofchk": ("spoofchk", True),
        "trust": ("trust", False),
        "link_state": ("link_state", 0),
        "rate": ("rate", (5, 500)),
    }
    assert [(c[0], c[3]) for c in node.fake.calls] == [restored[name] for name, _ in calls]


def test_all_settings_restored_in_reverse_order(node: Node) -> None:
    pf = node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(
        vlan=10,
        vlanQoS=1,
        mac="02:aa:bb:cc:dd:01",
        min_tx_rate=1,
        max_tx_rate=50,
        spoofchk="off",
        trust="on",
        link_state="enable",
    )

    node.add(conf, netns=pod)

    applied = [c[0] for c in node.fake.calls]
    assert applied == ["vlan", "mac", "rate", "spoofchk", "trust", "link_state"]
    node.fake.calls.clear()
    assert node.cni("DEL", conf, netns=pod).rc == 0
    assert node.fake.calls == [
        ("link_state", pf.name, 0, 0),
        ("trust", pf.name, 0, False),
        ("spoofchk", pf.name, 0, True),
        ("rate", pf.name, 0, (0, 0)),
        ("mac", pf.name, 0, "00:00:00:00:00:00"),
        ("vlan", pf.name, 0, (0, 0, 0x8100)),
    ]
    assert node.picture() == before


def test_a_setting_the_driver_does_not_report_is_left_alone_and_the_rest_restored(node: Node) -> None:
    # Some drivers report no trust flag: there is nothing to put back for
    # it, but the settings applied before it must still be restored.
    pf = node.add_pf(1)
    node.fake.state[pf.name][0]["trust"] = None
    pod = node.pod()
    before = node.picture()
    conf = node.conf(vlan=10, trust="on")
    node.add(conf, netns=pod)
    node.fake.calls.clear()

    assert node.cni("DEL", conf, netns=pod).rc == 0

    assert node.fake.calls == [("vlan", pf.name, 0, (0, 0, 0x8100))]
    assert node.picture() == {**before, "fake": {pf.name: {0: {**before["fake"][pf.name][0], "trust": True}}}}


def test_the_pf_reading_of_the_mac_goes_back_after_the_pod_drifted_it(node: Node) -> None:
    # igb records the MAC a VF programs itself in a pod as the PF's reading
    # of it; DEL puts the reading back although no MAC was configured.
    pf = node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf()
    node.add(conf, netns=pod)
    node.fake.state[pf.name][0]["mac"] = "02:00:00:00:d1:f7"

    assert node.cni("DEL", conf, netns=pod).rc == 0

    assert node.fake.calls == [("mac", pf.name, 0, ZERO_MAC)]
    assert node.picture() == before


MAC_CONF, MAC_ARGS, MAC_RUNTIME = "02:00:00:00:00:c1", "02:00:00:00:00:a2", "02:00:00:00:00:e3"


@pytest.mark.parametrize(
    "conf_mac,args_mac,runtime_mac,expected",
    [
        (MAC_CONF, None, None, MAC_CONF),
        (None, MAC_ARGS, None, MAC_ARGS),
        (None, None, MAC_RUNTIME, MAC_RUNTIME),
        (MAC_CONF, MAC_ARGS, None, MAC_ARGS),
        (MAC_CONF, None, MAC_RUNTIME, MAC_RUNTIME),
        (MAC_CONF, MAC_ARGS, MAC_RUNTIME, MAC_RUNTIME),
    ],
)
def test_mac_precedence(
    node: Node, conf_mac: str | None, args_mac: str | None, runtime_mac: str | None, expected: str
) -> None:
    pf = node.add_pf(1)
    vf = pf.vfs[0]
    assert vf.netdev
    pod = node.pod()
    before = node.picture()
    keys: dict[str, Any] = {}
    if conf_mac:
        keys["mac"] = conf_mac.upper()  # case does not matter
    if runtime_mac:
        keys["runtimeConfig"] = {"mac": runtime_mac}
    conf = node.conf("1.1.0", **keys)
    args = f"IgnoreUnknown=1;K8S_POD_NAME=p;MAC={args_mac}" if args_mac else "IgnoreUnknown=1;K8S_POD_NAME=p"

    res = node.add(conf, netns=pod, ifname="eth0", args=args)

    assert res.out["interfaces"][0]["mac"] == expected
    assert node.fake.state[pf.name][0]["mac"] == expected  # admin MAC via the PF
    inside = link("eth0", os.path.basename(pod))
    assert inside is not None and inside["address"] == expected  # effective MAC on the netdev
    assert node.cni("DEL", conf, netns=pod, ifname="eth0", args=args).rc == 0
    assert node.picture() == before


def test_each_invocation_closes_its_vf_control(node: Node) -> None:
    node.add_pf(1)
    pod = node.pod()
    conf = node.conf(vlan=3)
    node.add(conf, netns=pod)
    assert node.fake.closed == 1
    assert node.cni("DEL", conf, netns=pod).rc == 0
    assert node.fake.closed == 2


def test_del_undoes_what_the_pod_changed_on_the_netdev(node: Node) -> None:
    pf = node.add_pf(1)
    vf = pf.vfs[0]
    assert vf.netdev
    sh("ip", "link", "set", "dev", vf.netdev, "mtu", "1400", "alias", f"vf0 of {pf.name}")
    pod = node.pod()
    ns = os.path.basename(pod)
    before = node.picture()
    original = link(vf.netdev)
    assert original is not None
    conf = node.conf()
    node.add(conf, netns=pod, ifname="net1")
    # The pod owns its interface and may change it.  (Not its MAC here: a
    # veth reports no parent device, so DEL finds it in the pod by MAC.)
    sh("ip", "-n", ns, "link", "set", "dev", "net1", "mtu", "1300", "promisc", "on", "alias", "pod's own")

    assert node.cni("DEL", conf, netns=pod, ifname="net1").rc == 0

    back = link(vf.netdev)
    assert back is not None and netdev_view(back) == netdev_view(original)
    assert node.picture() == before


def test_the_record_names_the_pod_cni_args_name(node: Node) -> None:
    """Kubernetes runtimes pass the pod's namespace, name and UID in CNI_ARGS; status and metrics show them."""
    node.add_pf(2)
    args = "IgnoreUnknown=true;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=trainer-0;K8S_POD_UID=5f1e;K8S_POD_INFRA_CONTAINER_ID=x"
    node.add(node.conf(), netns=node.pod(), args=args)
    node.add(node.conf(), netns=node.pod(), container="ctr2")
    recorded = {(a.container_id, a.pod_namespace, a.pod_name, a.pod_uid) for a in FileStore(node.data_dir).all()}
    assert recorded == {("ctr1", "team-a", "trainer-0", "5f1e"), ("ctr2", "", "", "")}
