"""The RDMA netlink requests, compared byte for byte with iproute2's ``rdma`` tool, and a VF's RDMA devices in sysfs.

Real: the ``rdma`` tool of this machine, run for each operation under
strace, which dumps every request the tool sends.  Fixture: the kernel's
side.  A host kernel without ib_core has no NETLINK_RDMA, so strace hands
the tool a netlink socket of another protocol (NETLINK_USERSOCK) in place of
its own and swallows its sends, and this test answers each request from a
second socket the way nldev would (one device ``rxe0``, index 1, for the
tool's opening device dump; an empty ack otherwise).  What the tool sends
does not depend on the answers beyond that device's index.

Sysfs discovery runs on a temporary tree laid out as mlx5 VFs (fixture);
the guest tests run the same functions against the kernel's own RDMA.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import shutil
import socket
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sriov_cni.kernel import nlcore, rdma
from sriov_cni.kernel.netns import own_netns_path
from sriov_cni.kernel.nlerrors import Busy, LinkExists, LinkNotFound, NetlinkError, NotSupported
from tests.support.hostkernel import has_rdma_netlink
from tests.support.nodetree import Tree

NETLINK_USERSOCK = 2
HEX_LINE = re.compile(r"\s*\| [0-9a-f]{5}  ((?:[0-9a-f]{2} {1,2})+)")


def _header(data: bytes) -> tuple[int, int, int, int]:
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", data)
    return length, kind, flags, seq


def _answer(request: bytes) -> bytes:
    """What nldev would answer: the device dump lists rxe0 (index 1, one port), anything else is acked."""
    _, kind, flags, seq = _header(request)
    if flags & nlcore.NLM_F_DUMP:
        # RDMA_NLDEV_ATTR_PORT_INDEX (3): the device's one port.
        body = rdma.attr_u32(rdma.ATTR_DEV_INDEX, 1) + rdma.attr_u32(3, 1)
        body += rdma.attr_str(rdma.ATTR_DEV_NAME, "rxe0")
        device = struct.pack("=IHHII", 16 + len(body), kind, 2, seq, 0) + body
        return device + struct.pack("=IHHIIi", 20, nlcore.NLMSG_DONE, 2, seq, 0, 0)
    return struct.pack("=IHHIIi", 36, nlcore.NLMSG_ERROR, nlcore.NLM_F_CAPPED, seq, 0, 0) + request[:16]


def iproute2_requests(*args: str) -> list[bytes]:
    """Every request ``rdma ARGS`` sends, in order (its opening device dump first)."""
    tool = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_USERSOCK)
    kernel = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_USERSOCK)
    read_end, write_end = os.pipe()
    with tool, kernel:
        tool.bind((0, 0))
        kernel.bind((0, 0))
        fd = tool.fileno()
        # The tool binds port 0 and its sends go to the kernel (port 0):
        # both are swallowed, so it keeps the port bound here, where the
        # answers are sent.
        trace = ["strace", "-o", f"/dev/fd/{write_end}", "-e", "trace=socket,bind,sendto", "-e", f"write={fd}"]
        trace += ["-e", f"inject=socket:retval={fd}", "-e", "inject=bind:retval=0", "-e", "inject=sendto:retval=1"]
        proc = subprocess.Popen([*trace, "rdma", *args], pass_fds=[fd, write_end], stdout=subprocess.PIPE, text=True)
        os.close(write_end)
        requests: list[bytes] = []
        current: bytearray | None = None
        with os.fdopen(read_end) as lines:
            for line in lines:
                if line.startswith("sendto("):
                    current = bytearray()
                    continue
                m = HEX_LINE.match(line)
                if m is None or current is None:
                    continue
                current += bytes.fromhex(m.group(1).replace(" ", ""))
                if len(current) >= 4 and len(current) >= _header(bytes(current))[0]:
                    requests.append(bytes(current))
                    kernel.sendto(_answer(requests[-1]), (tool.getsockname()[0], 0))
                    current = None
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"rdma {' '.join(args)} failed: {out}"
    return requests


def _seq(request: bytes) -> int:
    return _header(request)[3]


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    for tool in ("rdma", "strace"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (run tests/setup-host.sh)")


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"rdmacap-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "del", name], check=True)


def test_the_device_dump_is_the_tools() -> None:
    dump = iproute2_requests("system", "show")[0]
    assert rdma.dev_dump_request(_seq(dump)) == dump


def test_reading_the_netns_mode() -> None:
    _, request = iproute2_requests("system", "show")
    assert rdma.sys_get_request(_seq(request)) == request


@pytest.mark.parametrize(("mode", "value"), [("exclusive", rdma.EXCLUSIVE), ("shared", rdma.SHARED)])
def test_setting_the_netns_mode(mode: str, value: int) -> None:
    _, request = iproute2_requests("system", "set", "netns", mode)
    assert rdma.sys_set_request(_seq(request), value) == request


def test_moving_a_device_by_netns_fd(netns: str) -> None:
    _, request = iproute2_requests("dev", "set", "rxe0", "netns", netns)
    # The fd is the tool's own open netns file: its number is what the
    # request carries, whatever it is.
    fd = struct.unpack_from("=I", rdma.parse_attrs(request[16:])[rdma.ATTR_NET_NS_FD])[0]
    assert rdma.move_request(_seq(request), 1, fd) == request


def test_reading_one_device_by_index() -> None:
    _, request = iproute2_requests("dev", "show", "rxe0")
    assert rdma.dev_get_request(_seq(request), 1) == request


def test_renaming_a_device() -> None:
    _, request = iproute2_requests("dev", "set", "rxe0", "name", "mlx5_9")
    assert rdma.rename_request(_seq(request), 1, "mlx5_9") == request


def test_adding_an_rxe_link() -> None:
    _, request = iproute2_requests("link", "add", "rxe7", "type", "rxe", "netdev", "eth3")
    assert rdma.newlink_request(_seq(request), "rxe7", "rxe", "eth3") == request


def test_deleting_a_link() -> None:
    _, request = iproute2_requests("link", "delete", "rxe0")
    assert rdma.dellink_request(_seq(request), 1) == request


def _error_answer(code: int, request: bytes, text: str | None) -> tuple[bytes, int]:
    flags = nlcore.NLM_F_CAPPED
    tail = b""
    if text is not None:
        flags |= nlcore.NLM_F_ACK_TLVS
        tail = rdma.attr_str(nlcore.NLMSGERR_ATTR_MSG, text)
    return struct.pack("=i", -code) + request[:16] + tail, flags


@pytest.mark.parametrize(
    ("code", "kind"),
    [(16, Busy), (17, LinkExists), (95, NotSupported), (19, LinkNotFound)],
)
def test_the_kernels_errors_become_the_kernel_layers(code: int, kind: type[Exception]) -> None:
    request = rdma.move_request(1, 3, 4)
    payload, flags = _error_answer(code, request, None)
    exc = rdma._error("moving rxe0", code, payload, flags)
    assert type(exc) is kind
    assert exc.errno == code


def test_a_name_clash_carries_the_extended_acks_text() -> None:
    request = rdma.move_request(1, 3, 4)
    payload, flags = _error_answer(17, request, "Duplicate device name in target netns")
    exc = rdma._error("moving rxe0", 17, payload, flags)
    assert isinstance(exc, LinkExists)
    assert str(exc) == "moving rxe0: File exists (Duplicate device name in target netns)"


def test_without_rdma_netlink_the_kernel_layer_says_so() -> None:
    """On a kernel without ib_core (this host's, as a rule) opening the socket is NotSupported."""
    try:
        probe = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, rdma.NETLINK_RDMA)
    except OSError:
        with pytest.raises(NotSupported, match="no RDMA netlink"):
            rdma.Rdma()
    else:
        probe.close()
        with rdma.Rdma() as handle:
            assert handle.netns_mode() in ("shared", "exclusive")


def test_a_failure_inside_the_pod_comes_back_as_the_kernel_layers_exception(netns: str) -> None:
    """Real: a throwaway namespace and this host's kernel, whose refusal (no RDMA netlink) the child meets there.

    What fails in the child comes back by errno as the exception callers act
    on (the guest's name clash: LinkExists), not as a namespace failure
    nobody above the kernel layer catches.
    """
    if has_rdma_netlink():
        pytest.fail("this host's kernel has RDMA netlink; the guest covers a refusal from inside the pod there")
    with pytest.raises(NetlinkError) as caught:
        rdma.move_out(f"/run/netns/{netns}", 1, own_netns_path())
    assert caught.value.errno == errno.EPROTONOSUPPORT
    assert "no RDMA netlink" in str(caught.value)


# Sysfs: mlx5 VFs as the kernel lays them out (fixture tree).


def _mlx5(tree: Tree, rdma_devices: dict[int, list[str]]) -> dict[int, str]:
    tree.pf("0000:3b:00.0", "ens1f0", driver="mlx5_core", numvfs=3)
    vfs = {}
    for index in range(3):
        pci = f"0000:3b:00.{index + 2}"
        tree.vf("0000:3b:00.0", index, pci, f"ens1f0v{index}", driver="mlx5_core")
        for name in rdma_devices.get(index, []):
            tree.rdma(pci, name)
        vfs[index] = pci
    return vfs


def test_a_vf_without_rdma_has_none(tree: Tree) -> None:
    vfs = _mlx5(tree, {})
    assert rdma.vf_rdma_devices(tree.sys, vfs[0]) == []


def test_each_mlx5_vf_has_its_own(tree: Tree) -> None:
    vfs = _mlx5(tree, {0: ["mlx5_2"], 1: ["mlx5_3"]})
    assert rdma.vf_rdma_devices(tree.sys, vfs[0]) == ["mlx5_2"]
    assert rdma.vf_rdma_devices(tree.sys, vfs[1]) == ["mlx5_3"]
    assert rdma.vf_rdma_devices(tree.sys, vfs[2]) == []


def test_two_devices_on_one_vf_are_both_reported(tree: Tree) -> None:
    vfs = _mlx5(tree, {1: ["mlx5_5", "mlx5_4"]})
    assert rdma.vf_rdma_devices(tree.sys, vfs[1]) == ["mlx5_4", "mlx5_5"]


def test_a_missing_function_has_none(tree: Tree) -> None:
    assert rdma.vf_rdma_devices(tree.sys, "0000:99:00.1") == []
    assert rdma.vf_verbs_devices(tree.sys, "0000:99:00.1") == {}


def test_a_device_in_another_namespace_shows_only_through_its_verbs_device(tree: Tree) -> None:
    vfs = _mlx5(tree, {})
    tree.rdma(vfs[0], "mlx5_2", uverbs=0)
    tree.rdma(vfs[1], "mlx5_3", uverbs=4, here=False)
    assert rdma.vf_rdma_devices(tree.sys, vfs[1]) == []
    assert rdma.vf_verbs_devices(tree.sys, vfs[1]) == {"uverbs4": "mlx5_3"}
    assert rdma.vf_verbs_devices(tree.sys, vfs[0]) == {"uverbs0": "mlx5_2"}
    assert rdma.vf_verbs_devices(tree.sys, vfs[2]) == {}


def _gid_entry(device: Path, port: int, index: int, gid: str, kind: str | None, netdev: str | None) -> None:
    """One GID table entry laid out as sysfs shows it (fixture); an unused entry has no readable type or netdev."""
    base = device / "ports" / str(port)
    base.mkdir(parents=True, exist_ok=True)
    (base / "link_layer").write_text("Ethernet\n")
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "gids" / str(index)).write_text(gid + "\n")
    # A directory reads as EISDIR: an unreadable attribute, like an unused entry's.
    for sub, value in (("types", kind), ("ndevs", netdev)):
        path = base / "gid_attrs" / sub / str(index)
        if value is None:
            path.mkdir()
        else:
            path.write_text(value + "\n")


LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"
V4 = rdma.gid_text(ipaddress.IPv4Address("10.81.0.2"))
V6 = rdma.gid_text(ipaddress.IPv6Address("fd00::2"))


def test_gid_text_is_sysfs_form() -> None:
    assert V4 == "0000:0000:0000:0000:0000:ffff:0a51:0002"
    assert V6 == "fd00:0000:0000:0000:0000:0000:0000:0002"


def test_the_roce_v2_entry_of_the_address_on_the_netdev_is_found(tmp_path: Path) -> None:
    """A RoCE device's table as the kernel fills it: v1 and v2 entries per address, link-local first."""
    dev = tmp_path / "rxe0"
    _gid_entry(dev, 1, 0, LINK_LOCAL, "IB/RoCE v1", "net1")
    _gid_entry(dev, 1, 1, LINK_LOCAL, "RoCE v2", "net1")
    _gid_entry(dev, 1, 2, V4, "IB/RoCE v1", "net1")
    _gid_entry(dev, 1, 3, V6, "RoCE v2", "net1")
    _gid_entry(dev, 1, 5, V4, "RoCE v2", "net1")
    _gid_entry(dev, 1, 4, "0000:0000:0000:0000:0000:0000:0000:0000", None, None)
    assert rdma._find_gid(dev, "net1", [V4, V6]) == 5
    # The order asked is the order preferred.
    assert rdma._find_gid(dev, "net1", [V6, V4]) == 3


def test_the_same_address_on_another_netdev_is_not_the_pods(tmp_path: Path) -> None:
    dev = tmp_path / "mlx5_0"
    _gid_entry(dev, 1, 2, V4, "RoCE v2", "eth9")
    assert rdma._find_gid(dev, "net1", [V4]) is None
    _gid_entry(dev, 1, 3, V4, "RoCE v2", "net1")
    assert rdma._find_gid(dev, "net1", [V4]) == 3


def test_an_address_not_in_the_table_yet_is_awaited(tmp_path: Path) -> None:
    dev = tmp_path / "rxe0"
    _gid_entry(dev, 1, 0, LINK_LOCAL, "RoCE v2", "net1")
    assert rdma._find_gid(dev, "net1", [V4]) is None


def test_an_infiniband_device_has_no_ip_gids(tmp_path: Path) -> None:
    dev = tmp_path / "mlx5_ib0"
    _gid_entry(dev, 1, 0, LINK_LOCAL, "IB/RoCE v1", None)
    (dev / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
    found = rdma._find_gid(dev, "net1", [V4])
    assert isinstance(found, str) and "not RoCE" in found
