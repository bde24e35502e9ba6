"""NRI's wire as the daemon's NRI plugin writes and reads it (sriov_cni.daemon.nriwire).

The expected bytes come from the formats' definitions, not from the
module: protobuf's encoding guide (varints, ``08 96 01`` for field 1 = 150,
``12 07 74 65 73 74 69 6e 67`` for field 2 = "testing"), ttrpc's 10-byte
header (length, stream id, type, flags; big-endian), NRI's mux frame
(connection id, length; big-endian) and the field numbers of NRI's
api.proto and ttrpc's request.proto.
"""

from __future__ import annotations

import struct

import pytest

from sriov_cni.daemon import nriwire
from sriov_cni.daemon.nriwire import Call, Configure, Device, Message, NewContainer, Reply, Trunk, WireError


def test_protobuf_fields_as_the_encoding_guide_writes_them() -> None:
    assert nriwire.field_varint(1, 150) == bytes.fromhex("089601")
    assert nriwire.field_str(2, "testing") == bytes.fromhex("120774657374696e67")
    assert nriwire.varint(300) == b"\xac\x02"
    # RLIM_INFINITY: 64 one bits, seven to a byte.
    assert nriwire.varint(nriwire.UNLIMITED) == b"\xff" * 9 + b"\x01"
    # A negative int64 is its two's complement, ten bytes.
    assert nriwire.varint(-1) == nriwire.varint(nriwire.UNLIMITED)
    # proto3 leaves zeros and empty strings out.
    assert nriwire.field_varint(3, 0) == nriwire.field_str(3, "") == b""


def test_fields_reads_every_wire_type_nri_may_send_and_keeps_repeats() -> None:
    data = (
        nriwire.field_varint(1, 7)
        + b"\x11"
        + struct.pack("<q", -5)  # field 2, fixed64: skipped
        + b"\x1d"
        + struct.pack("<i", 9)  # field 3, fixed32: skipped
        + nriwire.field_str(4, "a")
        + nriwire.field_str(4, "b")
    )
    assert nriwire.fields(data) == {1: [7], 4: [b"a", b"b"]}


@pytest.mark.parametrize(
    "data",
    [b"\x08", b"\x08\xff", b"\x0a\x05abc", b"\x0b", b"\x08" + b"\xff" * 10 + b"\x01"],
    ids=["no value", "varint cut", "string cut", "group", "varint too long"],
)
def test_fields_refuses_what_is_not_a_message(data: bytes) -> None:
    with pytest.raises(WireError):
        nriwire.fields(data)


def test_register_plugin_request() -> None:
    # RegisterPluginRequest{plugin_name=1, plugin_idx=2}.
    assert nriwire.register_plugin("sriov-cni", "10") == b"\x0a\x09sriov-cni\x12\x0210"


def test_a_call_in_its_frame() -> None:
    call = Call(nriwire.RUNTIME_SERVICE, "RegisterPlugin", b"\x0a\x01x")
    body = call.encode()
    assert body == (b"\x0a\x1cnri.pkg.api.v1alpha1.Runtime" + b"\x12\x0eRegisterPlugin" + b"\x1a\x03\x0a\x01x")
    frame = nriwire.frame(nriwire.RUNTIME_CONN, 1, nriwire.REQUEST, body)
    # mux: connection 2, length; ttrpc: length, stream 1, type 1 (request), flags 0.
    assert frame[:8] == struct.pack(">II", 2, 10 + len(body))
    assert frame[8:18] == struct.pack(">IIBB", len(body), 1, 1, 0)
    assert frame[18:] == body


@pytest.mark.parametrize("timeout", [0, 2_000_000_000, -1])
def test_calls_round_trip(timeout: int) -> None:
    call = Call(nriwire.PLUGIN_SERVICE, "CreateContainer", b"\x00\x01", timeout)
    assert Call.decode(call.encode()) == call


def test_replies() -> None:
    # Response{status=1 (empty: OK), payload=2}.
    assert Reply(b"x").encode() == b"\x0a\x00\x12\x01x"
    refused = Reply(code=nriwire.UNIMPLEMENTED, message="no")
    assert refused.encode() == b"\x0a\x06\x08\x0c\x12\x02no\x12\x00"
    for reply in (Reply(b"x"), refused, Reply()):
        assert Reply.decode(reply.encode()) == reply


def test_the_trunk_cuts_messages_however_the_bytes_come() -> None:
    a = nriwire.frame(1, 1, nriwire.REQUEST, b"first")
    b = nriwire.frame(2, 1, nriwire.RESPONSE, b"")
    c = nriwire.frame(1, 3, nriwire.REQUEST, b"x" * 70000)
    trunk = Trunk()
    got: list[Message] = []
    for byte in a + b + c:
        got += trunk.feed(bytes([byte]))
    assert got == [
        Message(1, 1, nriwire.REQUEST, 0, b"first"),
        Message(2, 1, nriwire.RESPONSE, 0, b""),
        Message(1, 3, nriwire.REQUEST, 0, b"x" * 70000),
    ]
    # A ttrpc message split over two frames of its connection.
    message = a[8:]
    split = struct.pack(">II", 1, 5) + message[:5] + struct.pack(">II", 1, len(message) - 5) + message[5:]
    assert list(Trunk().feed(split)) == [Message(1, 1, nriwire.REQUEST, 0, b"first")]


def test_the_trunk_refuses_oversized_frames() -> None:
    with pytest.raises(WireError, match="frame"):
        list(Trunk().feed(struct.pack(">II", 1, nriwire.MAX_FRAME + 1)))
    with pytest.raises(WireError, match="ttrpc message"):
        list(Trunk().feed(struct.pack(">II", 1, 10) + struct.pack(">IIBB", nriwire.MAX_MESSAGE + 1, 1, 1, 0)))


def test_configure_request() -> None:
    # ConfigureRequest{config=1, runtime_name=2, runtime_version=3,
    # registration_timeout=4, request_timeout=5, NRI_version=6}.
    body = (
        nriwire.field_str(1, "{}")
        + nriwire.field_str(2, "containerd")
        + nriwire.field_str(3, "2.1.9")
        + nriwire.field_varint(4, 5000)
        + nriwire.field_varint(5, 2000)
        + nriwire.field_str(6, "v0.9.0")
    )
    assert Configure.decode(body) == Configure("containerd", "2.1.9", 5000, 2000)


def test_the_subscription_is_create_container_alone() -> None:
    # ConfigureResponse{events=2}: CREATE_CONTAINER (4) is bit 1 << 3.
    assert nriwire.configure_response(nriwire.CREATE_CONTAINER) == b"\x10\x08"


def test_create_container_request_skips_what_it_does_not_read() -> None:
    labels = nriwire.field_bytes(5, nriwire.field_str(1, "app") + nriwire.field_str(2, "x"))
    pod = (
        nriwire.field_str(1, "sandbox-id")
        + nriwire.field_str(2, "pod-a")
        + nriwire.field_str(3, "uid")
        + nriwire.field_str(4, "default")
        + labels
        + nriwire.field_varint(9, 1234)
    )
    container = (
        nriwire.field_str(1, "ctr-id")
        + nriwire.field_str(2, "sandbox-id")
        + nriwire.field_str(3, "main")
        + nriwire.field_varint(4, 1)
        + nriwire.field_str(7, "/bin/sh")
        + nriwire.field_varint(14, 1_700_000_000)
    )
    body = nriwire.field_bytes(1, pod) + nriwire.field_bytes(2, container)
    assert NewContainer.decode(body) == NewContainer("sandbox-id", "default", "pod-a", "ctr-id", "main")


def _one(found: dict[int, list[int | bytes]], number: int) -> bytes:
    (value,) = found[number]
    assert isinstance(value, bytes)
    return value


def test_create_container_response_adds_the_devices_and_the_limit() -> None:
    devices = [Device("/dev/infiniband/uverbs3", 231, 195), Device("/dev/infiniband/rdma_cm", 10, 58)]
    body = nriwire.create_container_response(devices, 64 << 20)
    adjust = nriwire.fields(_one(nriwire.fields(body), 1))
    assert set(adjust) == {6, 7}
    linux = nriwire.fields(_one(adjust, 6))
    assert set(linux) == {1}
    decoded = []
    for raw in linux[1]:
        assert isinstance(raw, bytes)
        device = nriwire.fields(raw)
        mode = nriwire.fields(_one(device, 5))
        decoded.append((_one(device, 1), _one(device, 2), device[3], device[4], mode[1]))
    assert decoded == [
        (b"/dev/infiniband/uverbs3", b"c", [231], [195], [0o666]),
        (b"/dev/infiniband/rdma_cm", b"c", [10], [58], [0o666]),
    ]
    rlimit = nriwire.fields(_one(adjust, 7))
    assert rlimit == {1: [b"RLIMIT_MEMLOCK"], 2: [64 << 20], 3: [64 << 20]}
    # The first device, byte for byte: LinuxDevice{path=1, type=2, major=3,
    # minor=4, file_mode=5{value=1}}.
    first = linux[1][0]
    assert first == b"\x0a\x17/dev/infiniband/uverbs3\x12\x01c\x18\xe7\x01\x20\xc3\x01\x2a\x03\x08\xb6\x03"


def test_an_unlimited_memlock_is_rlim_infinity() -> None:
    body = nriwire.create_container_response([], None)
    adjust = nriwire.fields(_one(nriwire.fields(body), 1))
    assert set(adjust) == {7}
    assert nriwire.fields(_one(adjust, 7))[2] == [nriwire.UNLIMITED]


def test_a_synchronize_in_parts_is_answered_in_parts() -> None:
    # SynchronizeRequest{pods=1, containers=2, more=3}; SynchronizeResponse{update=1, more=2}.
    pod = nriwire.field_bytes(1, nriwire.field_str(1, "sandbox-id"))
    assert nriwire.synchronize_response(pod + nriwire.field_varint(3, 1)) == b"\x10\x01"
    assert nriwire.synchronize_response(pod) == b""
