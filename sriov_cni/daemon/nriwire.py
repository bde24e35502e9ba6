"""NRI's wire, as far as the daemon's NRI plugin speaks it: protobuf fields, ttrpc messages, the multiplexed trunk.

An NRI plugin connects to the runtime's socket (``/var/run/nri/nri.sock``)
and carries two ttrpc connections over it, each frame prefixed with its
connection's id and length (NRI's ``pkg/net/multiplex``): on connection 1
the runtime calls the plugin's ``Plugin`` service, on connection 2 the
plugin calls the runtime's ``Runtime`` service, ``RegisterPlugin`` first.
A ttrpc message is a 10-byte header (length, stream id, type, flags) and a
protobuf ``Request`` or ``Response`` wrapping the call's own message.

Written here rather than taken from a package: PyPI has no NRI or ttrpc
client (its ``containerd``, last released in 2021, is containerd's gRPC
API, which NRI plugins do not speak), and the ``protobuf`` runtime alone
would still need NRI's api.proto compiled into generated modules, kept in
step with NRI, for the few messages and fields used here.  Only those are encoded and decoded; every other field
is skipped as protobuf allows.  Field numbers are NRI's ``pkg/api/api.proto``
(package ``nri.pkg.api.v1alpha1``) and ttrpc's ``request.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
# The multiplexed connections (multiplex.PluginServiceConn, RuntimeServiceConn).
PLUGIN_CONN = 1
RUNTIME_CONN = 2
# ttrpc message types; a unary request closes its stream at once.
REQUEST = 1
RESPONSE = 2
FLAG_REMOTE_CLOSED = 1
# ttrpc's largest message; a trunk frame holds one message and its header.
MAX_MESSAGE = 4 << 20
MAX_FRAME = 10 + MAX_MESSAGE
# gRPC status codes a reply may carry.
OK = 0
UNIMPLEMENTED = 12
# NRI's Event enum; a plugin subscribes with the bit 1 << (event - 1).
CREATE_CONTAINER = 4
# POSIXRlimit.hard/soft for "no limit" (RLIM_INFINITY as a uint64).
UNLIMITED = (1 << 64) - 1

_MUX = struct.Struct(">II")
_TTRPC = struct.Struct(">IIBB")
_VARINT = 0
_LEN = 2


class WireError(Exception):
    """Bytes that are not what NRI sends: the connection cannot go on."""


# protobuf: only varints and length-delimited fields are written.


def varint(value: int) -> bytes:
    """``value`` (unsigned, below 2**64; a negative int64 as its two's complement) as a protobuf varint."""
    value &= UNLIMITED
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    """A varint field; proto3 leaves a zero out."""
    return varint(number << 3 | _VARINT) + varint(value) if value else b""


def field_bytes(number: int, value: bytes) -> bytes:
    """A length-delimited field (bytes, a string's UTF-8, an embedded message), written even when empty."""
    return varint(number << 3 | _LEN) + varint(len(value)) + value


def field_str(number: int, value: str) -> bytes:
    """A string field; proto3 leaves an empty one out."""
    return field_bytes(number, value.encode()) if value else b""


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("a protobuf varint runs past its message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def fields(data: bytes) -> dict[int, list[int | bytes]]:
    """A message's fields by number, each occurrence in order: varints as ints, length-delimited as bytes.

    Fixed-width fields are skipped: none of the fields read here has one.
    """
    out: dict[int, list[int | bytes]] = {}
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == _VARINT:
            value, at = _read_varint(data, at)
        elif kind == _LEN:
            size, at = _read_varint(data, at)
            if at + size > len(data):
                raise WireError(f"protobuf field {number} runs past its message")
            value, at = data[at : at + size], at + size
        elif kind in (1, 5):  # fixed64, fixed32
            at += 8 if kind == 1 else 4
            continue
        else:
            raise WireError(f"protobuf field {number} has wire type {kind}, which NRI does not send")
        out.setdefault(number, []).append(value)
    if at != len(data):
        raise WireError("a protobuf field runs past its message")
    return out


def _one_bytes(found: dict[int, list[int | bytes]], number: int) -> bytes:
    """The last occurrence of a length-delimited field (protobuf's rule), b"" when absent."""
    values = [v for v in found.get(number, []) if isinstance(v, bytes)]
    return values[-1] if values else b""


def _one_int(found: dict[int, list[int | bytes]], number: int) -> int:
    values = [v for v in found.get(number, []) if isinstance(v, int)]
    return values[-1] if values else 0


def _one_str(found: dict[int, list[int | bytes]], number: int) -> str:
    return _one_bytes(found, number).decode(errors="replace")


# ttrpc: Request{service=1, method=2, payload=3, timeout_nano=4},
# Response{status=1 (google.rpc.Status{code=1, message=2}), payload=2}.


@dataclass(frozen=True)
class Message:
    """One ttrpc message off a multiplexed connection."""

    conn: int
    stream: int
    kind: int
    flags: int
    body: bytes


@dataclass(frozen=True)
class Call:
    """A ttrpc Request: the service's and method's names, their message, and the caller's timeout (0: none)."""

    service: str
    method: str
    payload: bytes
    timeout_nano: int = 0

    def encode(self) -> bytes:
        return (
            field_str(1, self.service)
            + field_str(2, self.method)
            + field_bytes(3, self.payload)
            + field_varint(4, self.timeout_nano)
        )

    @classmethod
    def decode(cls, body: bytes) -> Call:
        found = fields(body)
        timeout = _one_int(found, 4)
        return cls(_one_str(found, 1), _one_str(found, 2), _one_bytes(found, 3), timeout - (1 << 64) * (timeout >> 63))


@dataclass(frozen=True)
class Reply:
    """A ttrpc Response: its status (code, message) and the method's answer."""

    payload: bytes = b""
    code: int = OK
    message: str = ""

    def encode(self) -> bytes:
        status = field_varint(1, self.code) + field_str(2, self.message)
        return field_bytes(1, status) + field_bytes(2, self.payload)

    @classmethod
    def decode(cls, body: bytes) -> Reply:
        found = fields(body)
        status = fields(_one_bytes(found, 1))
        return cls(_one_bytes(found, 2), _one_int(status, 1), _one_str(status, 2))


def frame(conn: int, stream: int, kind: int, body: bytes, flags: int = 0) -> bytes:
    """One ttrpc message in one trunk frame: NRI's mux hands each frame to ttrpc as one read."""
    message = _TTRPC.pack(len(body), stream, kind, flags) + body
    return _MUX.pack(conn, len(message)) + message


@dataclass
class Trunk:
    """What came in on the trunk so far, cut into ttrpc messages per multiplexed connection."""

    _raw: bytearray = field(default_factory=bytearray)
    # Each connection's bytes: ttrpc reads its connection as a stream, so
    # a message might span frames.
    _streams: dict[int, bytearray] = field(default_factory=dict)

    def feed(self, data: bytes) -> Iterator[Message]:
        """The complete messages ``data`` ends; WireError for a frame or message no runtime sends."""
        self._raw += data
        while len(self._raw) >= _MUX.size:
            conn, size = _MUX.unpack_from(self._raw)
            if size > MAX_FRAME:
                raise WireError(f"a {size}-byte frame on connection {conn}, above NRI's {MAX_FRAME}")
            if len(self._raw) < _MUX.size + size:
                break
            self._streams.setdefault(conn, bytearray()).extend(self._raw[_MUX.size : _MUX.size + size])
            del self._raw[: _MUX.size + size]
        for conn, stream in self._streams.items():
            while len(stream) >= _TTRPC.size:
                length, sid, kind, flags = _TTRPC.unpack_from(stream)
                if length > MAX_MESSAGE:
                    raise WireError(f"a {length}-byte ttrpc message on connection {conn}, above ttrpc's {MAX_MESSAGE}")
                if len(stream) < _TTRPC.size + length:
                    break
                body = bytes(stream[_TTRPC.size : _TTRPC.size + length])
                del stream[: _TTRPC.size + length]
                yield Message(conn, sid, kind, flags, body)


# NRI's messages, the fields used.


def register_plugin(name: str, index: str) -> bytes:
    """RegisterPluginRequest{plugin_name=1, plugin_idx=2}."""
    return field_str(1, name) + field_str(2, index)


@dataclass(frozen=True)
class Configure:
    """ConfigureRequest: who the runtime is, and its timeouts in milliseconds."""

    runtime_name: str
    runtime_version: str
    registration_timeout_ms: int
    request_timeout_ms: int

    @classmethod
    def decode(cls, body: bytes) -> Configure:
        found = fields(body)
        return cls(_one_str(found, 2), _one_str(found, 3), _one_int(found, 4), _one_int(found, 5))


def configure_response(*events: int) -> bytes:
    """ConfigureResponse{events=2}: the events subscribed to, a bit each."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return field_varint(2, mask)


def synchronize_response(request: bytes) -> bytes:
    """SynchronizeResponse{more=2} to SynchronizeRequest{more=3}: no update, and ``more`` echoed.

    A runtime with more pods and containers than one message holds sends
    them in parts, each but the last with ``more`` set, and drops a plugin
    whose answer does not echo it (one that cannot take parts).
    """
    return field_varint(2, _one_int(fields(request), 3))


@dataclass(frozen=True)
class NewContainer:
    """CreateContainerRequest{pod=1, container=2}: the pod's id, namespace and name, the container's id and name."""

    pod_id: str
    pod_namespace: str
    pod_name: str
    container_id: str
    container_name: str

    @classmethod
    def decode(cls, body: bytes) -> NewContainer:
        found = fields(body)
        # PodSandbox{id=1, name=2, namespace=4}, Container{id=1, name=3}.
        pod = fields(_one_bytes(found, 1))
        container = fields(_one_bytes(found, 2))
        return cls(_one_str(pod, 1), _one_str(pod, 4), _one_str(pod, 2), _one_str(container, 1), _one_str(container, 3))


@dataclass(frozen=True)
class Device:
    """A character device to create in the container, and to allow in its device cgroup."""

    path: str
    major: int
    minor: int
    mode: int = 0o666


def create_container_response(devices: list[Device], memlock: int | None) -> bytes:
    """CreateContainerResponse{adjust=1}: ``devices`` added, RLIMIT_MEMLOCK raised to ``memlock`` (None: unlimited).

    An empty response (b"") leaves the container unchanged.
    ContainerAdjustment{linux=6 (LinuxContainerAdjustment{devices=1}),
    rlimits=7}; LinuxDevice{path=1, type=2, major=3, minor=4,
    file_mode=5 (OptionalFileMode{value=1})}; POSIXRlimit{type=1, hard=2,
    soft=3}.  The runtime adds an allow rule to the device cgroup for each
    device it adds (its generator's AdjustDevices).
    """
    linux = b"".join(
        field_bytes(
            1,
            field_str(1, d.path)
            + field_str(2, "c")
            + field_varint(3, d.major)
            + field_varint(4, d.minor)
            + field_bytes(5, field_varint(1, d.mode)),
        )
        for d in devices
    )
    limit = UNLIMITED if memlock is None else memlock
    rlimit = field_str(1, "RLIMIT_MEMLOCK") + field_varint(2, limit) + field_varint(3, limit)
    return field_bytes(1, (field_bytes(6, linux) if linux else b"") + field_bytes(7, rlimit))
