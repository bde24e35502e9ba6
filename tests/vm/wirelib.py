"""What crossed the rig's wire (``rig.py --wire``), read from its capture.

The rig joins the guest's PF ports on one QEMU hub and records every frame on
it in a pcap file (rig.wire_arguments), which the guest sees at the path
``$SRIOV_CNI_VM_WIRE`` names.  QEMU appends one record per frame while the
guest runs; :class:`Wire` reads the records that came after a mark, so a test
looks only at the frames of its own traffic.

The pcap format (the classic one, link type Ethernet) is read with ``struct``:
no capture tool is needed in the guest or on the host.

With ``rig.py --wire --peer`` a second guest, the other node, shares the
wire; :class:`Peer` runs commands there, which it serves (:func:`serve`,
``python3 -m tests.vm.wirelib serve SHARE``) from its share.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vm.rig import PEER_ENV, PEER_STOP, WIRE_ENV

PCAP_MAGIC = 0xA1B2C3D4
PCAP_HEADER = 24
RECORD_HEADER = 16
LINKTYPE_ETHERNET = 1
# The tag protocol identifiers of 802.1Q and 802.1ad.
TPIDS = (0x8100, 0x88A8)
ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800
IPPROTO_ICMP = 1
IPPROTO_UDP = 17
ROCE_V2_PORT = 4791
ICMP_ECHO_REQUEST = 8
ICMP_ECHO_REPLY = 0
# IEEE 802's local experimental ethertypes: the tests' own frames, which
# nothing else on the wire sends.
ETH_P_TEST = 0x88B5
ETH_P_SENTINEL = 0x88B6
BROADCAST = "ff:ff:ff:ff:ff:ff"


class PcapError(Exception):
    """The capture is not a pcap file of Ethernet frames."""


@dataclass(frozen=True)
class Tag:
    """One VLAN tag as it was on the wire."""

    tpid: int
    pcp: int  # the priority (vlanQoS)
    dei: int
    vid: int


@dataclass(frozen=True)
class Frame:
    """One Ethernet frame as it crossed the wire (as captured; no FCS)."""

    seconds: float  # the capture's time stamp
    dst: str
    src: str
    tags: tuple[Tag, ...]
    ethertype: int  # after the tags
    payload: bytes  # after the tags and the ethertype
    length: int  # the frame's length on the wire, tags included

    @property
    def vids(self) -> tuple[int, ...]:
        return tuple(tag.vid for tag in self.tags)

    def arp_target(self) -> str | None:
        """The address an ARP request or reply is about (its target protocol address)."""
        if self.ethertype != ETH_P_ARP or len(self.payload) < 28:
            return None
        return ".".join(str(b) for b in self.payload[24:28])

    def ipv4(self) -> tuple[str, str] | None:
        """(source, destination) of an IPv4 packet."""
        if self.ethertype != ETH_P_IP or len(self.payload) < 20:
            return None
        return ".".join(str(b) for b in self.payload[12:16]), ".".join(str(b) for b in self.payload[16:20])

    def udp_ports(self) -> tuple[int, int] | None:
        """(source, destination) port of an IPv4 UDP datagram (RoCE v2 is UDP to ROCE_V2_PORT)."""
        if self.ipv4() is None or self.payload[9] != IPPROTO_UDP:
            return None
        header = (self.payload[0] & 0xF) * 4
        if len(self.payload) < header + 4:
            return None
        sport, dport = struct.unpack_from("!HH", self.payload, header)
        return sport, dport

    def icmp_type(self) -> int | None:
        """The ICMP type of an IPv4 ICMP packet (8 echo request, 0 echo reply)."""
        if self.ipv4() is None or self.payload[9] != IPPROTO_ICMP:
            return None
        header = (self.payload[0] & 0xF) * 4
        return self.payload[header] if len(self.payload) > header else None


def _mac(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def parse_frame(data: bytes, seconds: float = 0.0, length: int | None = None) -> Frame:
    """One captured Ethernet frame; its VLAN tags, however many, are peeled off in order."""
    if len(data) < 14:
        raise PcapError(f"a frame of {len(data)} bytes is shorter than an Ethernet header")
    at = 12
    tags: list[Tag] = []
    (ethertype,) = struct.unpack_from("!H", data, at)
    while ethertype in TPIDS and len(data) >= at + 6:
        (tci,) = struct.unpack_from("!H", data, at + 2)
        tags.append(Tag(ethertype, tci >> 13, (tci >> 12) & 1, tci & 0xFFF))
        at += 4
        (ethertype,) = struct.unpack_from("!H", data, at)
    return Frame(
        seconds=seconds,
        dst=_mac(data[0:6]),
        src=_mac(data[6:12]),
        tags=tuple(tags),
        ethertype=ethertype,
        payload=data[at + 2 :],
        length=len(data) if length is None else length,
    )


def pcap_byte_order(header: bytes) -> str:
    """``<`` or ``>``: the byte order the pcap file was written in (the writer's own)."""
    if len(header) < PCAP_HEADER:
        raise PcapError(f"the pcap header is {len(header)} bytes, not {PCAP_HEADER}")
    for order in "<>":
        (magic,) = struct.unpack_from(f"{order}I", header)
        if magic == PCAP_MAGIC:
            (linktype,) = struct.unpack_from(f"{order}I", header, 20)
            if linktype != LINKTYPE_ETHERNET:
                raise PcapError(f"the capture's link type is {linktype}, not Ethernet ({LINKTYPE_ETHERNET})")
            return order
    raise PcapError(f"not a pcap file (magic {header[:4].hex()})")


def read_records(data: bytes, order: str, start: int) -> tuple[list[Frame], int]:
    """The frames of the whole records in ``data`` from offset ``start``, and where the next record begins.

    A record QEMU is still writing is left for the next read.
    """
    frames: list[Frame] = []
    at = start
    while at + RECORD_HEADER <= len(data):
        sec, usec, caplen, length = struct.unpack_from(f"{order}IIII", data, at)
        end = at + RECORD_HEADER + caplen
        if end > len(data):
            break
        frames.append(parse_frame(data[at + RECORD_HEADER : end], sec + usec / 1e6, length))
        at = end
    return frames, at


class Wire:
    """The rig's wire capture, read by offsets that always fall between records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            self.order = pcap_byte_order(f.read(PCAP_HEADER))
        self._end = PCAP_HEADER

    def _read(self, start: int) -> tuple[list[Frame], int]:
        with self.path.open("rb") as f:
            f.seek(start)
            data = f.read()
        frames, used = read_records(data, self.order, 0)
        self._end = max(self._end, start + used)
        return frames, start + used

    def mark(self) -> int:
        """Where the frames from now on begin."""
        return self._read(self._end)[1]

    def since(self, mark: int) -> list[Frame]:
        """Every frame captured after ``mark``."""
        return self._read(mark)[0]

    def wait_for(
        self, mark: int, enough: Callable[[list[Frame]], bool], what: str, timeout: float = 30.0
    ) -> list[Frame]:
        """The frames after ``mark`` once ``enough`` holds for them; fail the test after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self.since(mark)
            if enough(frames):
                return frames
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} on the wire ({len(frames)} frames)")
            time.sleep(0.1)


# Run in a pod by :class:`Listener`: counts the frames its interface
# receives, by source MAC, destination MAC and ethertype, until a frame of
# the sentinel ethertype arrives.  Raw frames of every protocol (ETH_P_ALL);
# the pod's own sends show as outgoing and are not counted.
LISTEN = r"""
import json, socket, sys
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
sock.bind((sys.argv[1], 0))
print("ready", flush=True)
seen = {}
while True:
    frame, addr = sock.recvfrom(65535)
    if addr[2] == socket.PACKET_OUTGOING:
        continue
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == int(sys.argv[2]):
        break
    key = f"{frame[6:12].hex(':')} {frame[0:6].hex(':')} {ethertype}"
    seen[key] = seen.get(key, 0) + 1
print(json.dumps(seen), flush=True)
"""

# Run in a pod (or on the node) by send_frames: COUNT frames SRC -> DST of
# ethertype ETHERTYPE, SIZE bytes each, as fast as the queue takes them.
SEND = r"""
import socket, sys, time
ifname, dst, src, ethertype, count, size = sys.argv[1:7]
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
sock.bind((ifname, 0))
head = bytes.fromhex(dst.replace(":", "")) + bytes.fromhex(src.replace(":", "")) + int(ethertype).to_bytes(2, "big")
for n in range(int(count)):
    frame = head + n.to_bytes(4, "big")
    frame += bytes(max(0, int(size) - len(frame)))
    while True:
        try:
            sock.send(frame)
            break
        except OSError:
            # ENOBUFS: the interface's queue is full; it drains as the NIC sends.
            time.sleep(0.001)
"""


def _in(pod: str | None) -> list[str]:
    return ["ip", "netns", "exec", pod] if pod is not None else []


def send_frames(
    pod: str | None,
    ifname: str,
    src: str,
    count: int,
    *,
    dst: str = BROADCAST,
    ethertype: int = ETH_P_TEST,
    size: int = 60,
) -> None:
    """Send ``count`` raw frames from ``ifname`` in ``pod`` (None: the node), with the source MAC ``src``."""
    subprocess.run(
        [*_in(pod), sys.executable, "-c", SEND, ifname, dst, src, str(ethertype), str(count), str(size)],
        check=True,
        timeout=LISTEN_BOUND,
    )


# Only a fault keeps a listener from starting, or from seeing its sentinel, this long.
LISTEN_BOUND = 120.0


@dataclass(frozen=True)
class Received:
    """Frames of one source, destination and ethertype that a :class:`Listener` counted."""

    src: str
    dst: str
    ethertype: int
    count: int


class Listener:
    """What one pod's interface receives, until a sentinel frame ends the count.

    Frames reach a pod in the order the NIC delivered them: once the
    sentinel (sent after the traffic under test, on a path that reaches the
    pod) is in, every frame of that traffic that was going to reach the pod
    has been counted.
    """

    def __init__(self, pod: str, ifname: str) -> None:
        self.proc = subprocess.Popen(
            [*_in(pod), sys.executable, "-c", LISTEN, ifname, str(ETH_P_SENTINEL)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line != "ready\n":
            self.proc.kill()
            pytest.fail(f"the listener in {pod} did not start: {line}{self.proc.communicate()}")

    def counts(self) -> list[Received]:
        """The frames received, once the sentinel came."""
        try:
            out, err = self.proc.communicate(timeout=LISTEN_BOUND)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"no sentinel reached the listener within {LISTEN_BOUND:.0f} s: {self.proc.communicate()}")
        assert self.proc.returncode == 0, err
        seen: dict[str, int] = json.loads(out)
        return [Received(*_split(key), count) for key, count in seen.items()]


def _split(key: str) -> tuple[str, str, int]:
    src, dst, ethertype = key.split()
    return src, dst, int(ethertype)


def guest_wire() -> Wire:
    """The wire of this guest; fails the test in a guest the rig booted without ``--wire``."""
    path = os.environ.get(WIRE_ENV)
    if not path:
        pytest.fail(f"no wire in this guest ({WIRE_ENV} unset): boot it with tests/vm/rig.py --wire")
    return Wire(Path(path))


# How often the second guest looks for requests, and says it is alive (the
# rig's watchdog ends a guest whose console stays silent).  Each look is a
# directory read over 9p, which an idle guest pays for under TCG: 20 looks
# a second cost the second guest 30 s of CPU in a 98 s run.
SERVE_POLL = 0.2
SERVE_HEARTBEAT = 60.0
# How often the first guest looks for its answer.
REPLY_POLL = 0.1
# Only a fault makes one command on the other node take this long.
PEER_BOUND = 300.0


def serve(share: Path) -> None:
    """In the second guest of ``rig.py --wire --peer``: run the first guest's requests until the rig says stop.

    A request is a file ``NAME.request`` in ``share``: JSON with ``argv``,
    ``env`` (added to this process's) and ``stdin``.  Its answer is
    ``NAME.reply``: ``returncode``, ``stdout`` and ``stderr``.  Both are
    written under another name first and renamed, so neither side reads a
    file half written.
    """
    said = time.monotonic()
    while not (share / PEER_STOP).exists():
        for request in sorted(share.glob("*.request")):
            asked = json.loads(request.read_text())
            proc = subprocess.run(
                asked["argv"],
                input=asked["stdin"],
                env={**os.environ, **asked["env"]},
                capture_output=True,
                text=True,
                check=False,
            )
            answer = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
            partial = request.with_suffix(".partial")
            partial.write_text(json.dumps(answer))
            partial.rename(request.with_suffix(".reply"))
            request.unlink()
            print(f"peer: {' '.join(asked['argv'])[:120]}: status {proc.returncode}", flush=True)
            said = time.monotonic()
        if time.monotonic() - said > SERVE_HEARTBEAT:
            print("peer: waiting for requests", flush=True)
            said = time.monotonic()
        time.sleep(SERVE_POLL)


class Peer:
    """The other node of ``rig.py --wire --peer``: commands run there, as root, through its share."""

    def __init__(self, share: Path) -> None:
        self.share = share

    def run(
        self, argv: list[str], *, env: Mapping[str, str] | None = None, stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` on the other node, with ``env`` added to its environment and ``stdin`` as input."""
        name = uuid.uuid4().hex
        partial = self.share / f"{name}.partial"
        partial.write_text(json.dumps({"argv": argv, "env": dict(env or {}), "stdin": stdin}))
        partial.rename(self.share / f"{name}.request")
        reply = self.share / f"{name}.reply"
        deadline = time.monotonic() + PEER_BOUND
        while not reply.exists():
            if time.monotonic() > deadline:
                pytest.fail(f"the other node did not answer within {PEER_BOUND:.0f} s: {argv}")
            time.sleep(REPLY_POLL)
        answer = json.loads(reply.read_text())
        reply.unlink()
        return subprocess.CompletedProcess(argv, answer["returncode"], answer["stdout"], answer["stderr"])


def guest_peer() -> Peer:
    """The other node of this guest; fails the test in a guest the rig booted without ``--peer``."""
    path = os.environ.get(PEER_ENV)
    if not path:
        pytest.fail(f"no other node beside this guest ({PEER_ENV} unset): boot it with tests/vm/rig.py --wire --peer")
    return Peer(Path(path))


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 3:
        sys.exit("usage: python3 -m tests.vm.wirelib serve SHARE")
    serve(Path(sys.argv[2]))
