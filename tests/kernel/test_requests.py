"""The netlink request path itself, against the real kernel in a throwaway namespace.

Each request kind the plugin builds by hand (route attributes, address and
route dumps, link dumps longer than one datagram) is checked with ``ip -j``
as the oracle, and the socket-level cases are made to happen for real: the
kernel's errno reaching the caller, an answer longer than the receive
buffer, a request abandoned half-way through its answer.
"""

from __future__ import annotations

import ast
import copy
import errno
import ipaddress
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from sriov_cni.kernel import netlink, rtnl
from sriov_cni.kernel.netns import netlink_socket_in
from sriov_cni.kernel.vfcontrol import KernelVfControl
from sriov_cni.kernel.vfsettings import VLAN_PROTO_8021Q
from tests.support.pluginlib import Node, ip_json, link_names, sh


@pytest.fixture
def pod(node: Node) -> str:
    """A pod namespace holding d0 (up, with a peer d0p), for requests to work on."""
    path = node.pod()
    ns = os.path.basename(path)
    sh("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d0p")
    sh("ip", "-n", ns, "link", "set", "d0", "up")
    sh("ip", "-n", ns, "link", "set", "d0p", "up")
    return path


@pytest.fixture
def inside(pod: str) -> Iterator[netlink.Namespace]:
    with netlink.open_namespace(pod) as ns:
        yield ns


def _d0(inside: netlink.Namespace) -> int:
    found = inside.find("d0")
    assert found is not None
    return found.index


def test_route_attributes_reach_the_kernel(pod: str, inside: netlink.Namespace) -> None:
    ns = os.path.basename(pod)
    index = _d0(inside)
    inside.add_address(index, ipaddress.ip_interface("10.60.0.2/24"))
    inside.add_address(index, ipaddress.ip_interface("fd60::2/64"))
    net = ipaddress.ip_network
    gw4, gw6 = ipaddress.ip_address("10.60.0.1"), ipaddress.ip_address("fd60::1")
    inside.add_route(index, net("10.61.0.0/16"), gw4, priority=7, mtu=1300, advmss=1200)
    inside.add_route(index, net("0.0.0.0/0"), gw4, table=100)
    inside.add_route(index, net("10.62.0.0/16"), gw4, table=300)
    inside.add_route(index, net("10.63.0.0/16"), None, scope=253)
    inside.add_route(index, net("fd61::/64"), gw6, priority=5, table=300)

    def oracle(family: str) -> dict[str, dict[str, Any]]:
        got = ip_json(family, "-d", "route", "show", "table", "all", "proto", "static", netns=ns)
        return {f"{r['dst']} {r.get('table', 'main')}": r for r in got}

    v4, v6 = oracle("-4"), oracle("-6")
    assert set(v4) == {"10.61.0.0/16 main", "default 100", "10.62.0.0/16 300", "10.63.0.0/16 main"}
    assert set(v6) == {"fd61::/64 300"}
    assert v4["10.61.0.0/16 main"]["metric"] == 7
    assert v4["10.61.0.0/16 main"]["metrics"] == [{"mtu": 1300, "advmss": 1200}]
    assert v4["10.61.0.0/16 main"]["gateway"] == "10.60.0.1"
    assert v4["10.63.0.0/16 main"]["scope"] == "link" and "gateway" not in v4["10.63.0.0/16 main"]
    assert v4["default 100"]["gateway"] == "10.60.0.1"
    assert v6["fd61::/64 300"]["metric"] == 5 and v6["fd61::/64 300"]["gateway"] == "fd60::1"
    # The dump sees every table, and only this link's routes.
    added = {
        (net("10.61.0.0/16"), gw4),
        (net("0.0.0.0/0"), gw4),
        (net("10.62.0.0/16"), gw4),
        (net("10.63.0.0/16"), None),
        (net("fd61::/64"), gw6),
    }
    assert added <= set(inside.routes(index))
    peer = inside.find("d0p")
    assert peer is not None
    assert not added & set(inside.routes(peer.index))


def test_addresses_are_listed_per_link(pod: str, inside: netlink.Namespace) -> None:
    ns = os.path.basename(pod)
    index = _d0(inside)
    peer = inside.find("d0p")
    assert peer is not None
    inside.add_address(index, ipaddress.ip_interface("10.64.0.2/24"))
    inside.add_address(index, ipaddress.ip_interface("fd64::2/64"))
    inside.add_address(peer.index, ipaddress.ip_interface("10.64.0.3/24"))
    [entry] = ip_json("addr", "show", "dev", "d0", netns=ns)
    oracle = {ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}") for a in entry["addr_info"]}
    assert set(inside.addresses(index)) == oracle
    assert {ipaddress.ip_interface("10.64.0.2/24"), ipaddress.ip_interface("fd64::2/64")} <= oracle
    assert ipaddress.ip_interface("10.64.0.3/24") in inside.addresses(peer.index)
    assert ipaddress.ip_interface("10.64.0.3/24") not in oracle


def test_the_kernels_errno_reaches_the_caller(inside: netlink.Namespace) -> None:
    index = _d0(inside)
    with pytest.raises(netlink.LinkNotFound) as missing:
        inside.get(0x7FFFFFF0)
    assert missing.value.errno == errno.ENODEV
    address = ipaddress.ip_interface("10.65.0.2/24")
    inside.add_address(index, address)
    with pytest.raises(netlink.LinkExists) as twice:
        inside.add_address(index, address)
    assert twice.value.errno == errno.EEXIST
    with pytest.raises(netlink.InvalidArgument) as bad:
        inside.set_mtu(index, 10)
    assert bad.value.errno == errno.EINVAL
    # The socket stays usable after refusals.
    assert inside.get(index).name == "d0"


def test_a_refusal_carries_the_kernels_own_explanation(pod: str, inside: netlink.Namespace) -> None:
    # Real kernel: a gateway no route reaches, refused with an extended ack;
    # ip, sending the same request, is the oracle for its text.
    ns = os.path.basename(pod)
    oracle = subprocess.run(
        ["ip", "-n", ns, "route", "add", "10.66.0.0/24", "via", "10.67.0.1", "dev", "d0"],
        capture_output=True,
        text=True,
    )
    assert oracle.returncode != 0 and oracle.stderr.startswith("Error: "), oracle.stderr
    explanation = oracle.stderr.removeprefix("Error: ").strip().rstrip(".")
    with pytest.raises(netlink.NetlinkError) as refused:
        inside.add_route(_d0(inside), ipaddress.ip_network("10.66.0.0/24"), ipaddress.ip_address("10.67.0.1"))
    assert refused.value.errno == errno.ENETUNREACH
    assert (
        str(refused.value)
        == f"adding route 10.66.0.0/24 via 10.67.0.1 (link {_d0(inside)}): Network is unreachable ({explanation})"
    )
    # A refusal without one reads as before.
    with pytest.raises(netlink.LinkNotFound) as missing:
        inside.get(0x7FFFFFF0)
    assert "(" not in str(missing.value)


def test_a_link_dump_longer_than_one_datagram_is_read_to_its_end(pod: str, inside: netlink.Namespace) -> None:
    ns = os.path.basename(pod)
    # Over 1 KiB per link; the kernel sends at most 32 KiB per datagram.
    batch = "".join(f"link add m{i} type veth peer name m{i}p\n" for i in range(60))
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch, text=True, check=True)
    names = [link.name for link in inside.links()]
    assert len(names) == len(set(names))
    assert set(names) == link_names(ns)
    assert len(names) == 123


def test_an_answer_longer_than_the_receive_buffer_is_read_whole(pod: str) -> None:
    sock = netlink_socket_in(pod)
    conn = rtnl.Rtnl(sock)
    try:
        conn._buf = bytearray(64)  # far shorter than any link's answer
        ns = netlink.Namespace(conn, pod)
        found = ns.find("d0")
        assert found is not None and found.name == "d0"
        assert {link.name for link in ns.links()} == {"lo", "d0", "d0p"}
    finally:
        conn.close()


class _Abandoned(Exception):
    pass


def test_a_request_abandoned_before_its_answer_does_not_confuse_the_next(
    inside: netlink.Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    receive = rtnl.Rtnl._receive

    def abandon(self: rtnl.Rtnl) -> bytes:
        raise _Abandoned()

    # The dump is sent, then the caller gives up before reading any of it:
    # the whole answer stays queued on the socket.
    monkeypatch.setattr(rtnl.Rtnl, "_receive", abandon)
    with pytest.raises(_Abandoned):
        inside.links()
    monkeypatch.setattr(rtnl.Rtnl, "_receive", receive)
    found = inside.find("d0p")
    assert found is not None and found.name == "d0p"
    assert {link.name for link in inside.links()} == {"lo", "d0", "d0p"}


def test_a_link_reads_as_ip_reports_it(pod: str, inside: netlink.Namespace) -> None:
    ns = os.path.basename(pod)
    sh("ip", "-n", ns, "link", "set", "d0", "mtu", "1280", "promisc", "on", "alias", "the pod's first")
    sh("ip", "-n", ns, "link", "property", "add", "dev", "d0", "altname", "first-alt")
    sh("ip", "-n", ns, "link", "property", "add", "dev", "d0", "altname", "second-alt")
    sh("ip", "-n", ns, "link", "set", "d0p", "down")
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    # What rides d0p and what it is a port of (the riders DEL removes).
    sh("ip", "-n", ns, "link", "add", "link", "d0p", "name", "mv0", "type", "macvlan")
    sh("ip", "-n", ns, "link", "add", "vx0", "type", "vxlan", "id", "7", "dev", "d0p", "dstport", "4789")
    sh("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", ns, "link", "set", "mv0", "master", "br0")
    index = {e["ifname"]: e["ifindex"] for e in ip_json("-n", ns, "link", "show")}
    for name in ("d0", "d0p", "lo", "mv0", "vx0", "br0"):
        [entry] = ip_json("-n", ns, "-d", "link", "show", "dev", name)
        found = inside.find(name)
        assert found is not None
        up = "UP" in entry["flags"]
        # ip shows the carrier (LOWER_UP) of a link that is up only.
        carrier = "LOWER_UP" in entry["flags"] if up else found.carrier
        assert found == netlink.LinkInfo(
            index=entry["ifindex"],
            name=name,
            mac=entry["address"],
            mtu=entry["mtu"],
            up=up,
            carrier=carrier,
            promisc="PROMISC" in entry["flags"],
            altnames=tuple(entry.get("altnames", ())),
            alias=entry.get("ifalias", ""),
            parent_dev=entry.get("parentdev", ""),
            flags=found.flags,
            promiscuity=entry["promiscuity"],
            allmulti_count=entry["allmulti"],
            settings=tuple(
                # ip names group 0 "default".
                (key, 0 if entry[key] == "default" else int(entry[key]))
                for key in ("txqlen", "group", "gso_max_size", "gso_max_segs", "gro_max_size")
                if key in entry
            ),
            xdp=(),
            lower=index.get(entry.get("link", ""), 0),
            master=index.get(entry.get("master", ""), 0),
            kind=entry.get("linkinfo", {}).get("info_kind", ""),
            bound=(index[entry["linkinfo"]["info_data"]["link"]],) if name == "vx0" else (),
        )
        # The flags as ip names them.
        named = {"promisc": "PROMISC", "allmulti": "ALLMULTI", "multicast": "MULTICAST", "noarp": "NOARP"}
        assert {n for n, f in named.items() if found.flag(n)} == {n for n, f in named.items() if f in entry["flags"]}
    # Each of the settings made above shows, so the comparison covers them.
    d0 = inside.find("d0")
    assert d0 is not None and (d0.mtu, d0.promisc, d0.alias) == (1280, True, "the pod's first")
    assert d0.altnames == ("first-alt", "second-alt") and d0.up and not d0.carrier
    lo = inside.find("lo")
    assert lo is not None and lo.up and lo.carrier
    d0p, mv0, vx0 = (inside.find(n) for n in ("d0p", "mv0", "vx0"))
    assert d0p is not None and mv0 is not None and vx0 is not None
    assert (mv0.lower, mv0.kind, vx0.bound) == (d0p.index, "macvlan", (d0p.index,)) and mv0.master
    # A veth's peer is its IFLA_LINK, yet neither rides the other.
    assert [r.name for r in netlink.riders(inside.links(), d0p)] == ["vx0", "mv0"]


def _as_pyroute2_encodes_it(msg: rtnl.Message, msg_type: int, flags: int, seq: int) -> bytes:
    """pyroute2's bytes for ``msg``, its tables given the struct sizes the message corrects, for this encoding only."""
    tables = {cls: cls.fields for cls in msg.structs}
    try:
        for cls, fields in msg.structs.items():
            cls.fields = fields
        body = msg.cls()
        for key, value in msg.fields.items():
            body[key] = value
        body["attrs"] = copy.deepcopy(msg.attrs)  # pyroute2 rewrites the dicts it encodes
        header = body["header"]
        header["type"], header["flags"], header["sequence_number"], header["pid"] = msg_type, flags, seq, 0
        body.encode()
        return bytes(body.data)
    finally:
        for cls, fields in tables.items():
            cls.fields = fields


@pytest.fixture
def encodings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bytes, bytes]]:
    """Every request sent meanwhile: its type, our bytes and pyroute2's for the same message."""
    seen: list[tuple[int, bytes, bytes]] = []
    ours = rtnl.encode

    def both(msg: rtnl.Message, msg_type: int, flags: int, seq: int) -> bytes:
        data = ours(msg, msg_type, flags, seq)
        seen.append((msg_type, data, _as_pyroute2_encodes_it(msg, msg_type, flags, seq)))
        return data

    monkeypatch.setattr(rtnl, "encode", both)
    return seen


def test_every_link_address_and_route_request_is_encoded_as_pyroute2_would(
    pod: str, inside: netlink.Namespace, encodings: list[tuple[int, bytes, bytes]]
) -> None:
    index = _d0(inside)
    inside.get(index)
    inside.links()
    inside.set_up(index, False)
    inside.rename(index, "d0-renamed")
    inside.set_mtu(index, 1400)
    inside.set_mac(index, "02:00:00:00:61:01")
    inside.set_promisc(index, True)
    inside.set_alias(index, "the pod's")
    inside.add_altnames(index, ("alt-one", "alt-two"))
    inside.del_altnames(index, ("alt-one",))
    inside.set_up(index, True)
    net = ipaddress.ip_network
    inside.add_address(index, ipaddress.ip_interface("10.65.0.2/24"))
    inside.add_address(index, ipaddress.ip_interface("fd65::2/64"))
    inside.add_route(
        index,
        net("10.66.0.0/16"),
        ipaddress.ip_address("10.65.0.1"),
        priority=7,
        mtu=1300,
        advmss=1200,
        table=300,
        scope=0,
    )
    inside.add_route(index, net("::/0"), ipaddress.ip_address("fd65::1"))
    inside.addresses(index)
    inside.routes(index)
    with netlink.open_namespace() as host:
        other = host.find("lo")
        assert other is not None
    kinds = {kind for kind, _, _ in encodings}
    assert len(kinds) == 8, kinds  # GET/NEW of links, addresses and routes; NEW/DEL of link properties
    for kind, data, theirs in encodings:
        assert data == theirs, kind


def test_every_vf_request_is_encoded_as_pyroute2_would(
    monkeypatch: pytest.MonkeyPatch, encodings: list[tuple[int, bytes, bytes]]
) -> None:
    # No PF here: the requests are encoded and answered without the kernel.
    answer = rtnl.encode(rtnl.message(ifinfmsg, {"index": 7}, []), RTM_NEWLINK, 0, 1)
    encodings.clear()
    monkeypatch.setattr(
        rtnl.Rtnl,
        "request",
        lambda self, msg_type, msg, flags=0: [answer] if rtnl.encode(msg, msg_type, flags, 1) else [],
    )
    vfc = KernelVfControl()
    try:
        assert vfc.vfs("pf0") == {}
        vfc.set_mac("pf0", 3, "02:00:00:00:62:01")
        vfc.set_vlan("pf0", 3, 100, 5, VLAN_PROTO_8021Q)
        vfc.set_vlan("pf0", 3, 100, 5, 0x88A8)
        vfc.set_spoofchk("pf0", 3, False)
        vfc.set_trust("pf0", 3, True)
        vfc.set_link_state("pf0", 3, 2)
        vfc.set_rate("pf0", 3, 10, 1000)
    finally:
        vfc.close()
    assert len(encodings) == 8
    for kind, data, theirs in encodings:
        assert data == theirs, kind


def _vlan_info(request: bytes) -> bytes:
    """The IFLA_VF_VLAN_INFO payload in a VF's VLAN list request."""
    vflist, vfinfo, vlist = ifinfmsg.vflist, ifinfmsg.vflist.vfinfo, ifinfmsg.vflist.vfinfo.vf_vlist
    [infos] = rtnl.attributes(request)[rtnl.numbers(ifinfmsg)["IFLA_VFINFO_LIST"]]
    [info] = rtnl.attributes(infos, 0)[rtnl.numbers(vflist)["IFLA_VF_INFO"]]
    [vlans] = rtnl.attributes(info, 0)[rtnl.numbers(vfinfo)["IFLA_VF_VLAN_LIST"]]
    [payload] = rtnl.attributes(vlans, 0)[rtnl.numbers(vlist)["IFLA_VF_VLAN_INFO"]]
    return bytes(payload)


def test_the_8021ad_vlan_is_sent_at_the_kernels_size_and_pyroute2_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The table as pyroute2 ships it, from a process that never loaded our modules.
    shipped = ast.literal_eval(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg\n"
                "print(repr(ifinfmsg.vflist.vfinfo.vf_vlist.ivvi.fields))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    sent: list[bytes] = []

    def request(self: rtnl.Rtnl, msg_type: int, msg: rtnl.Message, flags: int = 0) -> list[bytes]:
        sent.append(rtnl.encode(msg, msg_type, flags, 1))
        return []

    monkeypatch.setattr(rtnl.Rtnl, "request", request)
    vfc = KernelVfControl()
    try:
        vfc.set_vlan("pf0", 3, 100, 5, 0x88A8)
    finally:
        vfc.close()
    # struct ifla_vf_vlan_info: vf, vlan, qos, __be16 vlan_proto, two bytes of tail padding.
    assert _vlan_info(sent[0]) == struct.pack("=III", 3, 100, 5) + struct.pack("!H", 0x88A8) + bytes(2)
    # Another user of pyroute2 in this process still encodes by pyroute2's own table.
    ivvi = ifinfmsg.vflist.vfinfo.vf_vlist.ivvi
    assert ivvi.fields == shipped
    theirs = ifinfmsg()
    theirs["attrs"] = [
        ("IFLA_IFNAME", "pf0"),
        (
            "IFLA_VFINFO_LIST",
            {
                "attrs": [
                    (
                        "IFLA_VF_INFO",
                        {
                            "attrs": [
                                (
                                    "IFLA_VF_VLAN_LIST",
                                    {
                                        "attrs": [
                                            ("IFLA_VF_VLAN_INFO", {"vf": 3, "vlan": 100, "qos": 5, "proto": 0x88A8})
                                        ]
                                    },
                                ),
                            ]
                        },
                    )
                ]
            },
        ),
    ]
    theirs["header"]["type"] = RTM_NEWLINK
    theirs.encode()
    shipped_size = sum(struct.calcsize(f if f[0] in "<>!" else "=" + f) for _, f in shipped)
    assert len(_vlan_info(bytes(theirs.data))) == shipped_size


def test_an_unknown_pf_is_named_as_not_found() -> None:
    # The PF is named in each request; the kernel's ENODEV says it is gone.
    vfc = KernelVfControl()
    try:
        with pytest.raises(netlink.LinkNotFound, match="PF no-such-pf0 not found"):
            vfc.vfs("no-such-pf0")
        with pytest.raises(netlink.LinkNotFound, match="PF no-such-pf0 not found"):
            vfc.set_trust("no-such-pf0", 0, True)
    finally:
        vfc.close()
