"""Configuration validation, through dispatch: each bad input names its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sriov_cni.cni import Code
from tests.ipam.ipamtypes import Invoke, MakeConf, Stored

V4 = {"subnet": "10.1.0.0/24"}


def _ranges(*sets: list[Any]) -> dict[str, Any]:
    # Any: some of the sets below are malformed on purpose.
    return {"ranges": list(sets)}


BAD_IPAM: list[tuple[str, dict[str, Any], str]] = [
    ("no ranges", {}, "ipam.ranges is missing"),
    ("ranges not a list", {"ranges": {"subnet": "10.0.0.0/24"}}, "ipam.ranges must be a list"),
    ("empty set", _ranges([]), "ipam.ranges[0] must be a non-empty list"),
    ("range not an object", _ranges(["10.0.0.0/24"]), "ipam.ranges[0][0] must be an object"),
    ("subnet missing", _ranges([{"gateway": "10.0.0.1"}]), "ipam.ranges[0][0].subnet is missing"),
    ("subnet not CIDR", _ranges([{"subnet": "ten"}]), 'ipam.ranges[0][0].subnet "ten" is not a CIDR'),
    ("v4 too small", _ranges([{"subnet": "10.0.0.0/31"}]), "ipam.ranges[0][0].subnet 10.0.0.0/31 is too small"),
    ("v6 too small", _ranges([{"subnet": "2001:db8::/127"}]), "ipam.ranges[0][0].subnet 2001:db8::/127 is too small"),
    ("host bits", _ranges([{"subnet": "10.0.0.5/24"}]), "ipam.ranges[0][0].subnet 10.0.0.5/24 has host bits set"),
    (
        "rangeStart outside",
        _ranges([V4, {"subnet": "10.2.0.0/24", "rangeStart": "10.1.0.5"}]),
        "ipam.ranges[0][1].rangeStart 10.1.0.5 is outside subnet 10.2.0.0/24",
    ),
    (
        "rangeEnd outside",
        _ranges([{"subnet": "10.2.0.0/24", "rangeEnd": "10.3.0.9"}]),
        "ipam.ranges[0][0].rangeEnd 10.3.0.9 is outside subnet 10.2.0.0/24",
    ),
    (
        "rangeStart not an address",
        _ranges([{"subnet": "10.2.0.0/24", "rangeStart": "first"}]),
        'ipam.ranges[0][0].rangeStart "first" is not an IP address',
    ),
    (
        "start after end",
        _ranges([{"subnet": "10.2.0.0/24", "rangeStart": "10.2.0.9", "rangeEnd": "10.2.0.3"}]),
        "ipam.ranges[0][0].rangeStart 10.2.0.9 is after rangeEnd 10.2.0.3",
    ),
    (
        "gateway outside",
        _ranges([{"subnet": "10.2.0.0/24", "gateway": "10.9.0.1"}]),
        "ipam.ranges[0][0].gateway 10.9.0.1 is outside subnet 10.2.0.0/24",
    ),
    (
        "gateway handed out by another range",
        _ranges(
            [
                {"subnet": "10.2.0.0/24", "rangeStart": "10.2.0.10", "rangeEnd": "10.2.0.19", "gateway": "10.2.0.25"},
                {"subnet": "10.2.0.0/24", "rangeStart": "10.2.0.20", "rangeEnd": "10.2.0.29", "gateway": "10.2.0.1"},
            ]
        ),
        "ipam.ranges[0][0].gateway 10.2.0.25 is inside ipam.ranges[0][1]",
    ),
    (
        "overlap within a set",
        _ranges([V4, {"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.200"}]),
        "ipam.ranges[0][1] 10.1.0.0/24 (10.1.0.200-10.1.0.254) overlaps ipam.ranges[0][0]",
    ),
    (
        "overlap across sets",
        _ranges([V4], [{"subnet": "10.1.0.0/25"}]),
        "ipam.ranges[1][0] 10.1.0.0/25 (10.1.0.1-10.1.0.126) overlaps ipam.ranges[0][0]",
    ),
    (
        "two families in one set",
        _ranges([V4, {"subnet": "2001:db8::/64"}]),
        "ipam.ranges[0][1].subnet 2001:db8::/64 is IPv6 but ipam.ranges[0] is IPv4",
    ),
    ("legacy subnet", {"subnet": "10.0.0.0/32"}, "ipam.subnet 10.0.0.0/32 is too small"),
    (
        "legacy rangeStart",
        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"},
        "ipam.rangeStart 10.0.1.1 is outside subnet 10.0.0.0/24",
    ),
    (
        "legacy range overlapping ranges",
        {"subnet": "10.1.0.0/24", **_ranges([V4])},
        "ipam.ranges[0][0] 10.1.0.0/24 (10.1.0.1-10.1.0.254) overlaps ipam 10.1.0.0/24",
    ),
    ("routes not a list", {**_ranges([V4]), "routes": {"dst": "0.0.0.0/0"}}, "ipam.routes must be a list"),
    ("route dst", {**_ranges([V4]), "routes": [{"dst": "default"}]}, 'ipam.routes[0].dst "default" is not a CIDR'),
    (
        "route gw family",
        {**_ranges([V4]), "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "2001:db8::1"}]},
        "ipam.routes[1].gw 2001:db8::1 is not the same address family",
    ),
    ("dataDir", {**_ranges([V4]), "dataDir": 5}, "ipam.dataDir must be a non-empty string"),
    ("resolvConf", {**_ranges([V4]), "resolvConf": "/nonexistent/resolv.conf"}, "ipam.resolvConf /nonexistent"),
]


@pytest.mark.parametrize("ipam, message", [c[1:] for c in BAD_IPAM], ids=[c[0] for c in BAD_IPAM])
def test_bad_ipam_section_is_invalid_config_naming_the_field(
    cni: Invoke, netconf: MakeConf, ipam: dict[str, Any], message: str
) -> None:
    conf = netconf()
    conf["ipam"] = {"type": "sriov-ipam", "dataDir": conf["ipam"]["dataDir"], **ipam}
    for command in ("ADD", "CHECK"):
        got = cni(command, conf)
        assert got.rc == 1
        assert got.code == Code.INVALID_CONFIG
        assert message in got.msg, got.msg


def test_missing_ipam_section(cni: Invoke, netconf: MakeConf) -> None:
    conf = netconf()
    del conf["ipam"]
    got = cni("ADD", conf)
    assert (got.rc, got.code, got.msg) == (1, Code.INVALID_CONFIG, "ipam must be an object")


BAD_REQUESTS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "outside every range",
        {"runtimeConfig": {"ips": ["10.9.0.5"]}},
        "",
        "runtimeConfig.ips[0] 10.9.0.5 is not inside",
    ),
    ("gateway", {}, "IgnoreUnknown=1;IP=10.1.0.1", "CNI_ARGS IP 10.1.0.1 is the gateway of ipam.ranges[0][0]"),
    ("not an address", {"args": {"cni": {"ips": ["ten"]}}}, "", 'args.cni.ips[0] "ten" is not an IP address'),
    ("prefix mismatch", {"args": {"cni": {"ips": ["10.1.0.7/16"]}}}, "", "args.cni.ips[0] 10.1.0.7/16 has prefix /16"),
    (
        "two for one set",
        {"runtimeConfig": {"ips": ["10.1.0.7", "10.1.0.8"]}},
        "",
        "runtimeConfig.ips[1] 10.1.0.8 and runtimeConfig.ips[0] 10.1.0.7 both fall in ipam.ranges[0]",
    ),
    ("not a list", {"runtimeConfig": {"ips": "10.1.0.7"}}, "", 'runtimeConfig.ips "10.1.0.7" must be a list'),
]


@pytest.mark.parametrize("extra, cni_args, message", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requested_address_names_its_source(
    cni: Invoke, netconf: MakeConf, stored: Stored, extra: dict[str, Any], cni_args: str, message: str
) -> None:
    conf = {**netconf([[V4]]), **extra}
    got = cni("ADD", conf, cni_args=cni_args)
    assert (got.rc, got.code) == (1, Code.INVALID_CONFIG)
    assert message in got.msg, got.msg
    assert stored() == {}


def test_defaults_exclude_network_gateway_and_broadcast(cni: Invoke, netconf: MakeConf) -> None:
    # A /30 has .0 network, .1 gateway (default), .3 broadcast: only .2 is left.
    conf = netconf([[{"subnet": "10.5.0.0/30"}]])
    first = cni("ADD", conf, cid="a")
    assert first.addresses() == ["10.5.0.2/30"]
    assert first.out is not None and first.out["ips"][0]["gateway"] == "10.5.0.1"
    second = cni("ADD", conf, cid="b")
    assert (second.rc, second.code) == (1, Code.NOT_AVAILABLE)


def test_ipv6_default_range_includes_the_last_address(cni: Invoke, netconf: MakeConf) -> None:
    # IPv6 has no broadcast: a /126 hands out ::2 and ::3 (::1 is the gateway).
    conf = netconf([[{"subnet": "2001:db8::/126"}]])
    got = [cni("ADD", conf, cid=c).addresses()[0] for c in ("a", "b")]
    assert got == ["2001:db8::2/126", "2001:db8::3/126"]


def test_legacy_single_range_is_range_set_zero(cni: Invoke, netconf: MakeConf, net_dir: Path) -> None:
    conf = netconf(
        [[{"subnet": "10.7.0.0/24", "rangeStart": "10.7.0.50", "rangeEnd": "10.7.0.60"}]],
        subnet="10.6.0.0/24",
        rangeStart="10.6.0.20",
        gateway="10.6.0.254",
    )
    got = cni("ADD", conf)
    assert got.addresses() == ["10.6.0.20/24", "10.7.0.50/24"]
    assert got.out is not None and got.out["ips"][0]["gateway"] == "10.6.0.254"
    assert (net_dir / "last_reserved_ip.0").read_text() == "10.6.0.20"
    assert (net_dir / "last_reserved_ip.1").read_text() == "10.7.0.50"


def test_resolv_conf_becomes_result_dns(cni: Invoke, netconf: MakeConf, tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(
        "# comment\nnameserver 10.0.0.53\nnameserver 10.0.0.54\ndomain example.org\nsearch a.org b.org\noptions ndots:2\n"
    )
    got = cni("ADD", netconf([[V4]], resolvConf=str(resolv)))
    assert got.rc == 0
    assert got.out is not None and got.out["dns"] == {
        "nameservers": ["10.0.0.53", "10.0.0.54"],
        "domain": "example.org",
        "search": ["a.org", "b.org"],
        "options": ["ndots:2"],
    }
