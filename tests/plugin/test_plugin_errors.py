"""Bad input and failures: the right CNI error on stdout, non-zero exit, and the node exactly as before."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from sriov_cni.kernel import netlink
from tests.support.pluginlib import Node, Ready, addresses, ipam_reservations, link, refused, sh


def test_malformed_json(ready: Ready) -> None:
    node, pod, before = ready
    refused(node.cni("ADD", b'{"cniVersion": "1.0.0", "name": ', netns=pod), 6)
    refused(node.cni("ADD", b'["not", "an", "object"]', netns=pod), 6)
    assert node.picture() == before


@pytest.mark.parametrize("missing", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])
@pytest.mark.parametrize("how", ["absent", "empty"])
def test_missing_cni_variable(ready: Ready, missing: str, how: str) -> None:
    node, pod, before = ready
    env = node.env("ADD", netns=pod)
    if how == "absent":
        del env[missing]
    else:
        env[missing] = ""
    res = node.run(env, json.dumps(node.conf()).encode())
    refused(res, 4)
    assert missing in res.out["msg"]
    assert node.picture() == before


def test_unknown_cni_version(ready: Ready) -> None:
    node, pod, before = ready
    refused(node.cni("ADD", node.conf("9.9.9"), netns=pod), 1)
    assert node.picture() == before


BAD_CONFIGS = {
    "vlan as string": {"vlan": "100"},
    "vlan as bool": {"vlan": True},
    "mac as number": {"mac": 12},
    "pfNames as string": {"pfNames": "eth0"},
    "vlan 5000": {"vlan": 5000},
    "qos without vlan": {"vlanQoS": 3},
    "qos 8": {"vlan": 10, "vlanQoS": 8},
    "802.1ad without vlan id": {"vlan": 0, "vlanProto": "802.1ad"},
    "unknown vlanProto": {"vlan": 10, "vlanProto": "802.1x"},
    "bad mac": {"mac": "02:00:00:00:00"},
    "multicast mac": {"mac": "01:00:5e:00:00:01"},
    "bad runtime mac": {"runtimeConfig": {"mac": "zz:00:00:00:00:01"}},
    "bad link_state": {"link_state": "up"},
    "min above max": {"min_tx_rate": 100, "max_tx_rate": 10},
    "unknown PF": {"pfNames": ["nosuchpf0"]},
    "unknown PF PCI": {"pfNames": ["0000:99:00.0"]},
    "VF range past numvfs": {"pfNames": ["{pf}#1-5"]},
    "unknown deviceID": {"deviceID": "0000:99:10.0"},
    "deviceID not a PCI address": {"deviceID": "eth0"},
    "no VF source": {"pfNames": []},
    "bad network name": {"name": "bad name"},
}


@pytest.mark.parametrize("keys", BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_bad_config_is_code_7(ready: Ready, keys: dict[str, Any]) -> None:
    node, pod, before = ready
    if "pfNames" in keys:
        keys = {"pfNames": [e.replace("{pf}", node.pfs[0].name) for e in keys["pfNames"]]}
    res = node.cni("ADD", node.conf(**keys), netns=pod)
    refused(res, 7)
    assert node.picture() == before
    assert node.fake.calls == []


# The value as the config has it, in JSON: what a user wrote and would grep for.
VALUES_AS_JSON = {
    "vlan as bool": ({"vlan": True}, "vlan must be an integer, got true"),
    "pfNames with null": ({"pfNames": [None]}, "pfNames must be a list of PF names or PCI addresses, got [null]"),
    "ipam as list": ({"ipam": ["host-local"]}, 'ipam must be an object, got ["host-local"]'),
    "link_state": ({"link_state": "up"}, 'link_state must be "auto", "enable" or "disable", got "up"'),
    "deviceID": ({"deviceID": False}, "deviceID must be a PCI address like 0000:3b:02.0, got false"),
    "runtimeConfig.mac": (
        {"runtimeConfig": {"mac": {"a": None}}},
        'runtimeConfig.mac must be a string, got {"a": null}',
    ),
}


@pytest.mark.parametrize("keys, msg", VALUES_AS_JSON.values(), ids=VALUES_AS_JSON.keys())
def test_config_errors_show_values_as_json(ready: Ready, keys: dict[str, Any], msg: str) -> None:
    node, pod, _before = ready
    res = node.cni("ADD", node.conf(**keys), netns=pod)
    refused(res, 7)
    assert res.out["msg"] == msg


def test_bad_mac_in_cni_args(ready: Ready) -> None:
    node, pod, before = ready
    refused(node.cni("ADD", node.conf(), netns=pod, args="IgnoreUnknown=1;MAC=nonsense"), 7)
    assert node.picture() == before


def test_netns_that_does_not_exist(ready: Ready) -> None:
    node, _pod, before = ready
    refused(node.cni("ADD", node.conf(), netns="/var/run/netns/svpod-nonexistent"), 8)
    assert node.picture() == before


def test_ifname_already_in_the_pod(ready: Ready) -> None:
    node, pod, _ = ready
    ns = os.path.basename(pod)
    # No dummy module here: a veth pair inside the pod stands in for the pod's own interface.
    sh("ip", "-n", ns, "link", "add", "net1", "address", "02:11:22:33:44:55", "type", "veth", "peer", "name", "own1")
    sh("ip", "-n", ns, "addr", "add", "192.0.2.9/24", "dev", "net1")
    sh("ip", "-n", ns, "link", "set", "net1", "up")
    before = node.picture()
    other = link("net1", ns)

    refused(node.cni("ADD", node.conf(), netns=pod, ifname="net1"), 7)

    assert node.picture() == before
    assert link("net1", ns) == other
    assert addresses("net1", ns) == {"192.0.2.9/24"}


def test_setting_refused_by_the_driver_rolls_back_what_was_applied(ready: Ready) -> None:
    node, pod, before = ready
    pf = node.pfs[0].name
    node.fake.refuse["link_state"] = netlink.NotSupported("setting link_state 2: Operation not supported", 95)
    conf = node.conf(
        vlan=7, vlanQoS=2, mac="02:00:00:00:0f:01", max_tx_rate=100, spoofchk="off", trust="on", link_state="disable"
    )

    res = node.cni("ADD", conf, netns=pod)

    refused(res, 100)
    assert "link_state" in res.out["msg"]
    assert node.fake.calls == [
        ("vlan", pf, 0, (7, 2, 0x8100)),
        ("mac", pf, 0, "02:00:00:00:0f:01"),
        ("rate", pf, 0, (0, 100)),
        ("spoofchk", pf, 0, False),
        ("trust", pf, 0, True),
        ("link_state", pf, 0, 2),
        # Rollback: what was applied, in reverse; the refused one is not retried.
        ("trust", pf, 0, False),
        ("spoofchk", pf, 0, True),
        ("rate", pf, 0, (0, 0)),
        ("mac", pf, 0, "00:00:00:00:00:00"),
        ("vlan", pf, 0, (0, 0, 0x8100)),
    ]
    assert node.picture() == before


def test_a_refused_rate_names_the_keys_the_network_gave_it_with(ready: Ready) -> None:
    """Fixture: the PF side (igb refuses ``min_tx_rate``: EINVAL); real: the VF netdev and the pod's netns."""
    node, pod, before = ready
    node.fake.refuse["rate"] = netlink.InvalidArgument("setting tx rate 10-0 Mbps: Invalid argument")

    res = node.cni("ADD", node.conf(min_tx_rate=10), netns=pod)

    refused(res, 100)
    assert res.out["msg"].startswith("cannot set min_tx_rate/max_tx_rate on VF "), res.out
    assert "tx rate 10-0 Mbps" in res.out["details"], res.out
    assert node.picture() == before


def test_ipam_failure_after_the_move_rolls_back(ready: Ready) -> None:
    node, pod, before = ready
    # A one-address pool already held by another attachment: IPAM ADD fails
    # after the VF is in the pod.
    ipam = node.sriov_ipam("10.43.0.0/24", rangeStart="10.43.0.5", rangeEnd="10.43.0.5")
    holder = node.conf(name="sriov-net", ipam=ipam)
    node.add(holder, netns=node.pod(), container="holder")
    before = node.picture()

    res = node.cni("ADD", holder, netns=pod, container="late")

    # The IPAM's own code (50: no address left) reaches the runtime.
    refused(res, 50)
    assert node.picture() == before
    assert ipam_reservations(node.ipam_dir, "sriov-net") == {"10.43.0.5"}


def test_configuring_the_address_fails_after_ipam_add_releases_it(ready: Ready) -> None:
    node, pod, before = ready
    # IPAM succeeds, then the route's gateway is unreachable from the pod's
    # subnet, so configuring the pod fails: the address must be released too.
    ipam = node.host_local("10.44.0.0/24", routes=[{"dst": "10.45.0.0/16", "gw": "198.51.100.1"}])
    res = node.cni("ADD", node.conf(ipam=ipam), netns=pod)
    refused(res, 100)
    assert node.picture() == before
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


def test_ipam_plugin_not_found(ready: Ready) -> None:
    node, pod, before = ready
    res = node.cni("ADD", node.conf(ipam={"type": "no-such-ipam"}), netns=pod)
    refused(res, 7)
    assert node.picture() == before


def test_add_twice_for_one_attachment_is_refused(node: Node) -> None:
    node.add_pf(2)
    pod = node.pod()
    node.add(node.conf(), netns=pod)
    before = node.picture()
    refused(node.cni("ADD", node.conf(), netns=pod), 7)
    assert node.picture() == before
