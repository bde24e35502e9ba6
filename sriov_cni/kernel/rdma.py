"""RDMA devices through the kernel's RDMA netlink (NETLINK_RDMA, its "nldev" client), and a VF's in sysfs.

pyroute2 has no RDMA netlink, so this module writes the requests itself: a
netlink header whose type is ``(RDMA_NL_NLDEV << 10) + command``, no family
header, then attributes, as include/uapi/rdma/rdma_netlink.h lays them out.
What the module does:

* the netns mode: *shared* (every RDMA device visible in every network
  namespace) or *exclusive* (a device lives in one namespace, and verbs
  from any other get EPERM); it can only change while no namespace but the
  host's exists;
* the devices a namespace sees, by name and index; one device by its index
  (which, unlike its name, a move or a rename never changes);
* moving a device into a namespace by an open fd of it: the request must be
  sent from inside the namespace the device is in, else the kernel does not
  find it (ENODEV); :func:`move_out` sends it from there;
* renaming a device;
* creating and removing a link (a Soft-RoCE ``rxe`` device on a netdev);
* finding an address's RoCE v2 GID index in a device's GID table (sysfs:
  no netlink request lists GIDs).

Failures raise the kernel layer's exceptions (:mod:`sriov_cni.kernel.nlerrors`):
:class:`Busy` (EBUSY), :class:`LinkExists` (a name clash: EEXIST with the
kernel's extended-ack text on a move, ENFILE on a new link), :class:`NotSupported` (EOPNOTSUPP: a driver
that cannot move its device, or no such link type) and :class:`LinkNotFound`
(ENODEV: no such device in this namespace).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sriov_cni.kernel import nlcore
from sriov_cni.kernel.netns import NamespaceError, netlink_socket_in, open_netns, run_in_netns
from sriov_cni.kernel.nlcore import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST
from sriov_cni.kernel.nlerrors import BY_ERRNO, LinkExists, NetlinkError, NotSupported, for_errno
from sriov_cni.kernel.sysfs import pci_dir

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5

CMD_GET = 1
CMD_SET = 2
CMD_NEWLINK = 3
CMD_DELLINK = 4
CMD_SYS_GET = 6
CMD_SYS_SET = 7

ATTR_DEV_INDEX = 1
ATTR_DEV_NAME = 2
ATTR_NDEV_NAME = 51
ATTR_LINK_TYPE = 65
ATTR_NETNS_MODE = 66
ATTR_NET_NS_FD = 68

# The kernel's values of the netns mode attribute.
EXCLUSIVE, SHARED = 0, 1

_HEADER = nlcore.HEADER


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to four bytes."""
    raw = nlcore.ATTR.pack(nlcore.ATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (nlcore.align(len(raw)) - len(raw))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def attr_u8(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=B", value))


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def message(command: int, seq: int, attrs: bytes = b"", flags: int = NLM_F_REQUEST | NLM_F_ACK) -> bytes:
    """An nldev request: header, then ``attrs``; the port id is left to the kernel (0)."""
    kind = (RDMA_NL_NLDEV << 10) + command
    return _HEADER.pack(_HEADER.size + len(attrs), kind, flags, seq, 0) + attrs


# The requests, as bytes, so the tests compare them with what iproute2's
# rdma tool sends for the same operation.


def sys_get_request(seq: int) -> bytes:
    return message(CMD_SYS_GET, seq)


def sys_set_request(seq: int, mode: int) -> bytes:
    return message(CMD_SYS_SET, seq, attr_u8(ATTR_NETNS_MODE, mode))


def dev_dump_request(seq: int) -> bytes:
    return message(CMD_GET, seq, flags=NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP)


def dev_get_request(seq: int, dev_index: int) -> bytes:
    return message(CMD_GET, seq, attr_u32(ATTR_DEV_INDEX, dev_index))


def rename_request(seq: int, dev_index: int, name: str) -> bytes:
    return message(CMD_SET, seq, attr_u32(ATTR_DEV_INDEX, dev_index) + attr_str(ATTR_DEV_NAME, name))


def move_request(seq: int, dev_index: int, netns_fd: int) -> bytes:
    return message(CMD_SET, seq, attr_u32(ATTR_DEV_INDEX, dev_index) + attr_u32(ATTR_NET_NS_FD, netns_fd))


def newlink_request(seq: int, name: str, link_type: str, netdev: str) -> bytes:
    attrs = attr_str(ATTR_DEV_NAME, name) + attr_str(ATTR_LINK_TYPE, link_type) + attr_str(ATTR_NDEV_NAME, netdev)
    return message(CMD_NEWLINK, seq, attrs)


def dellink_request(seq: int, dev_index: int) -> bytes:
    return message(CMD_DELLINK, seq, attr_u32(ATTR_DEV_INDEX, dev_index))


def parse_attrs(data: bytes) -> dict[int, bytes]:
    """Top-level attributes by type (the nested flag bits cleared); the last one of a type wins."""
    return {kind: bytes(payloads[-1]) for kind, payloads in nlcore.attributes(data).items()}


def _u32(raw: bytes) -> int:
    return int(struct.unpack_from("=I", raw)[0])


def _str(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class RdmaDevice:
    """An RDMA device as one namespace sees it."""

    index: int
    name: str


def _device(payload: bytes) -> RdmaDevice | None:
    attrs = parse_attrs(payload)
    if ATTR_DEV_INDEX in attrs and ATTR_DEV_NAME in attrs:
        return RdmaDevice(_u32(attrs[ATTR_DEV_INDEX]), _str(attrs[ATTR_DEV_NAME]))
    return None


class Rdma(nlcore.Socket):
    """An RDMA netlink socket in one network namespace (``netns`` None: this process's).

    Requests name devices as that namespace sees them: in exclusive mode,
    only the devices that live there.
    """

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns
        try:
            if netns is None:
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_RDMA)
            else:
                sock = netlink_socket_in(netns, NETLINK_RDMA)
        except OSError as exc:
            # EPROTONOSUPPORT: no ib_core in this kernel.
            raise NotSupported(f"the kernel has no RDMA netlink: {exc.strerror}", exc.errno or 0) from exc
        super().__init__(sock)
        sock.bind((0, 0))

    def __enter__(self) -> Rdma:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _answers(self, request: bytes, what: str) -> Iterator[tuple[int, bytes]]:
        """Send ``request``; yield each answer's (type, payload) until its ack or the dump's end."""
        seq = _HEADER.unpack_from(request)[3]
        self.send(request)
        for kind, _, answer in self.answers(seq, lambda code, payload, flags: _error(what, code, payload, flags)):
            if kind != nlcore.NLMSG_DONE:
                yield kind, answer[_HEADER.size :]

    def _do(self, request: bytes, what: str) -> None:
        for _ in self._answers(request, what):
            pass

    def netns_mode(self) -> str:
        """``"shared"`` or ``"exclusive"``."""
        for _, payload in self._answers(sys_get_request(self.next_seq()), "reading the RDMA netns mode"):
            raw = parse_attrs(payload).get(ATTR_NETNS_MODE)
            if raw:
                return "shared" if raw[0] == SHARED else "exclusive"
        raise NetlinkError("reading the RDMA netns mode: the kernel's answer has no mode", errno.EPROTO)

    def set_netns_mode(self, mode: str) -> None:
        """Switch to ``"shared"`` or ``"exclusive"``; :class:`Busy` while other namespaces exist."""
        value = {"shared": SHARED, "exclusive": EXCLUSIVE}[mode]
        self._do(sys_set_request(self.next_seq(), value), f"setting the RDMA netns mode to {mode}")

    def devices(self) -> list[RdmaDevice]:
        """Every RDMA device this namespace sees."""
        answers = self._answers(dev_dump_request(self.next_seq()), "listing RDMA devices")
        return [dev for _, payload in answers if (dev := _device(payload)) is not None]

    def device(self, name: str) -> RdmaDevice:
        """The device called ``name`` here; :class:`LinkNotFound` if this namespace has none."""
        for dev in self.devices():
            if dev.name == name:
                return dev
        raise for_errno(f"RDMA device {name}", errno.ENODEV)

    def get(self, index: int) -> RdmaDevice:
        """The device of index ``index``, as this namespace names it; :class:`LinkNotFound` if it is not here.

        One answer, however many devices the node has.
        """
        what = f"reading RDMA device {index}"
        try:
            for _, payload in self._answers(dev_get_request(self.next_seq(), index), what):
                dev = _device(payload)
                if dev is not None:
                    return dev
        except NetlinkError as exc:
            # nldev answers an index it does not know in this namespace
            # with EINVAL (nldev_get_doit), not ENODEV.
            if exc.errno != errno.EINVAL:
                raise
        raise for_errno(f"RDMA device {index}: not in this namespace", errno.ENODEV)

    def find(self, index: int) -> RdmaDevice | None:
        """:meth:`get`, None when the device is not in this namespace."""
        try:
            return self.get(index)
        except NetlinkError as exc:
            if exc.errno == errno.ENODEV:
                return None
            raise

    def move(self, index: int, netns: str) -> None:
        """Move device ``index`` (one this namespace sees) into the namespace at ``netns``.

        Only from the host's namespace: out of any other, see :func:`move_out`.
        An index this namespace does not see is refused with EINVAL
        (:class:`InvalidArgument`), as :meth:`get` finds.
        """
        fd = open_netns(netns)
        try:
            self.move_by_fd(index, fd, f"moving RDMA device {index} to {netns}")
        finally:
            os.close(fd)

    def move_by_fd(self, index: int, netns_fd: int, what: str) -> None:
        self._do(move_request(self.next_seq(), index, netns_fd), what)

    def rename(self, index: int, name: str) -> None:
        """Rename device ``index`` (one this namespace sees); :class:`LinkExists` when ``name`` is taken here."""
        self._do(rename_request(self.next_seq(), index, name), f"renaming RDMA device {index} to {name}")

    def add_link(self, name: str, link_type: str, netdev: str) -> None:
        """``rdma link add NAME type LINK_TYPE netdev NETDEV``: a software RDMA device on a netdev."""
        self._do(
            newlink_request(self.next_seq(), name, link_type, netdev),
            f"adding {link_type} device {name} on {netdev}",
        )

    def delete_link(self, name: str) -> None:
        """Remove a software RDMA device (rxe, siw)."""
        index = self.device(name).index
        self._do(dellink_request(self.next_seq(), index), f"removing RDMA device {name}")


def move_out(netns: str, index: int, target: str) -> None:
    """Move device ``index`` out of the namespace at ``netns`` into ``target``.

    The kernel checks the namespace of the *thread* that sends the request,
    not only its socket's: from outside, the device is not found (ENODEV).
    So a short-lived child enters ``netns`` and sends it, with ``target``
    opened here first (inside, this process's namespace path would name the
    pod's).
    """
    fd = open_netns(target)
    what = f"moving RDMA device {index} from {netns} to {target}"

    def inside() -> None:
        try:
            with Rdma() as handle:
                handle.move_by_fd(index, fd, what)
        except NetlinkError as exc:
            # Carried to the parent as an errno and a text (run_in_netns).
            raise OSError(exc.errno, str(exc)) from exc

    try:
        run_in_netns(netns, inside)
    except NamespaceError as exc:
        # The child's errno, back as the exception callers act on (a name
        # clash: LinkExists).
        raise BY_ERRNO.get(exc.errno, NetlinkError)(str(exc), exc.errno) from exc
    finally:
        os.close(fd)


def _error(what: str, code: int, payload: bytes, flags: int) -> NetlinkError:
    """The exception for an error answer, with the kernel's extended-ack text when it sent one."""
    text = nlcore.ack_text(payload, flags)
    if code == errno.ENFILE:
        # The RDMA core answers a device name already taken with ENFILE
        # (seen for rxe's newlink), not EEXIST.
        return LinkExists(f"{what}: the name is taken" + (f" ({text})" if text else ""), code)
    return for_errno(what, code, text)


def vf_rdma_devices(root: Path, pci: str) -> list[str]:
    """The RDMA devices of a PCI function that this namespace sees (``<function>/infiniband/<name>``).

    None for most NICs; one for an mlx5, irdma or bnxt_re VF; a function
    can have two (mlx5 with a second RDMA personality), which the caller
    must refuse to guess between.  The RDMA class is namespaced like the
    net class: in exclusive mode a device moved into another namespace is
    not listed here (see :func:`vf_verbs_devices`), exactly as a moved
    netdev leaves ``<function>/net/``.
    """
    try:
        return sorted(os.listdir(pci_dir(root, pci) / "infiniband"))
    except OSError:
        return []


def vf_verbs_devices(root: Path, pci: str) -> dict[str, str]:
    """The RDMA devices of a PCI function in every namespace: their names by character device (``uverbsN``).

    ib_uverbs' class is not namespaced, so its entries under the function
    (``<function>/infiniband_verbs/uverbsN/ibdev``) show every device,
    wherever it lives, by the name it has there.  Empty without ib_uverbs.
    """
    verbs = pci_dir(root, pci) / "infiniband_verbs"
    try:
        entries = sorted(os.listdir(verbs))
    except OSError:
        return {}
    out = {}
    for entry in entries:
        try:
            out[entry] = (verbs / entry / "ibdev").read_text().strip()
        except OSError:
            continue  # removed while read: the device is moving or going
    return out


def uverbs_device(root: Path, pci: str, name: str) -> str | None:
    """The character device (``uverbsN``) of RDMA device ``name``: among its PCI function's, else any (a Soft-RoCE one has no PCI parent)."""
    for entry, ibdev in vf_verbs_devices(root, pci).items():
        if ibdev == name:
            return entry
    for path in sorted((root / "class" / "infiniband_verbs").glob("uverbs*/ibdev")):
        try:
            if path.read_text().strip() == name:
                return path.parent.name
        except OSError:
            continue
    return None


# How often the GID table is read again while the address's entry is awaited.
GID_POLL = 0.05


def gid_text(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as sysfs prints a GID: an IPv4 address as its IPv4-mapped IPv6 form, eight groups of four digits."""
    if address.version == 4:
        address = ipaddress.IPv6Address(f"::ffff:{address}")
    return address.exploded


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        # An unused entry's type and netdev cannot be read (EINVAL), and an
        # entry can be emptied while it is read.
        return None


def _find_gid(device_dir: Path, netdev: str, wanted: list[str]) -> int | str | None:
    """One pass over the device's GID tables: the index of the first of ``wanted`` found as RoCE v2 on ``netdev``.

    A text when it can never be there (no port on Ethernet: an InfiniBand
    device, whose GIDs are not IP addresses); None when it is not there yet.
    """
    ports = sorted((device_dir / "ports").iterdir()) if (device_dir / "ports").is_dir() else []
    found: dict[str, int] = {}
    ethernet = False
    for port in ports:
        if _read(port / "link_layer") != "Ethernet":
            continue
        ethernet = True
        gids = port / "gids"
        for name in os.listdir(gids):
            gid = _read(gids / name)
            if gid not in wanted or gid in found:
                continue
            attrs = port / "gid_attrs"
            if _read(attrs / "types" / name) != "RoCE v2":
                continue
            # The same address on another netdev of the device is not this one.
            if _read(attrs / "ndevs" / name) not in (netdev, None):
                continue
            found[gid] = int(name)
    if not ethernet:
        return f"{device_dir.name} has no Ethernet port: it is not RoCE, and its GIDs are not IP addresses"
    for gid in wanted:
        if gid in found:
            return found[gid]
    return None


def roce_v2_gid_index(
    netns: str,
    sys_root: Path,
    device: str,
    netdev: str,
    addresses: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address],
    wait: float,
) -> int | str:
    """The GID table index of the first of ``addresses`` as a RoCE v2 GID of ``device`` on ``netdev``, in ``netns``.

    Else a text saying why there is none.  The kernel adds an address's
    GIDs from a work item after the address is set (roce_gid_mgmt), so the
    entry is awaited, up to ``wait`` seconds.  Read in the namespace, from
    a sysfs mounted there: in exclusive mode only that one shows the device.
    """
    wanted = [gid_text(a) for a in addresses]
    read_end, write_end = os.pipe()

    def inside() -> None:
        device_dir = sys_root / "class" / "infiniband" / device
        deadline = time.monotonic() + wait
        while True:
            try:
                found = _find_gid(device_dir, netdev, wanted)
            except OSError as exc:
                found = f"cannot read {device}'s GID table: {exc.strerror or exc}"
            if found is None and time.monotonic() > deadline:
                found = f"no RoCE v2 GID of {', '.join(map(str, addresses))} on {device} within {wait:g} s"
            if found is not None:
                os.write(write_end, str(found).encode())
                return
            time.sleep(GID_POLL)

    try:
        run_in_netns(netns, inside, own_sysfs=sys_root)
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as r:
            read_end = -1
            answer = r.read().decode()
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    return int(answer) if answer.isdigit() else answer
