"""The frame between the CNI executables and the daemon, defined here once: their contract, as :mod:`cni` is the runtime's.

The daemon (:mod:`sriov_cni.daemon.intake` reads requests, a call's child,
:mod:`sriov_cni.daemon.child`, answers them) and the Python executable
(:mod:`sriov_cni.daemon.client`) use this module; the static shim
(shim/sriov-shim.c) has the same constants compiled in, and
tests/daemon/test_wire.py checks both against one table.

Request, executable to daemon::

    4-byte big-endian length N, with the caller's stdin, stdout and stderr
    attached (SCM_RIGHTS), then N bytes:
    version NUL program NUL cwd NUL KEY=VALUE NUL KEY=VALUE ...

Answer, daemon to executable: a tag byte, then

* ``EXITED``: one byte, the plugin's exit status;
* ``REFUSED``: a CNI error object (JSON and a newline) up to the end of the
  connection.  Nothing of the call ran.

The tag keeps "refused" out of the exit statuses' value space.  An
executable that reads no tag at all knows the daemon ended during the call,
which may have partly run.

Only the standard library's C modules are imported: the Python executable
starts with ``-S`` and must stay fast.
"""

from __future__ import annotations

import _socket
import _struct

# The request's length field, before the body.
HEADER = "!I"
HEADER_SIZE = 4
# The caller's stdin, stdout and stderr, in that order.
DESCRIPTORS = 3
# The largest request body (version, program, working directory and
# environment) the daemon accepts; the shim refuses a larger one itself.
MAX_REQUEST = 1 << 20
EXITED = ord("X")
REFUSED = ord("R")
# Seconds an executable waits for the daemon to accept (its listen queue is
# full, or it is stopped) before it says the daemon is not reachable.
CONNECT_TIMEOUT = 5


def encode_request(version: str, program: str, cwd: str, env: dict[str, str]) -> bytes:
    """The header and the body; the descriptors go with the header."""
    fields = [version, program, cwd] + [f"{k}={v}" for k, v in env.items()]
    body = "\0".join(fields).encode("utf-8", "surrogateescape")
    return _struct.pack(HEADER, len(body)) + body


def send_request(conn: _socket.socket, frame: bytes, fds: tuple[int, int, int]) -> None:
    """Send an encoded request, the caller's stdin, stdout and stderr attached to its header."""
    rights = _struct.pack(f"{DESCRIPTORS}i", *fds)
    conn.sendmsg([frame[:HEADER_SIZE]], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    conn.sendall(frame[HEADER_SIZE:])


def exchange(conn: _socket.socket, frame: bytes, fds: tuple[int, int, int]) -> bytes:
    """Send a request on a connected ``conn`` and read the answer: ``EXITED`` and the status, or ``REFUSED`` and the error object.

    Empty when the daemon closed the connection without a tag; only the tag
    when it ended right after.  A refusal is read to the end of the
    connection; an unknown tag (another version's daemon) is returned alone.
    """
    send_request(conn, frame, fds)
    answer = conn.recv(1)
    if answer == bytes([EXITED]):
        return answer + conn.recv(1)
    while answer[:1] == bytes([REFUSED]):
        chunk = conn.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


def request_size(header: bytes) -> int:
    (size,) = _struct.unpack(HEADER, header)
    return int(size)


def decode_head(body: bytes) -> tuple[str, str, str]:
    """The version, program and working directory of a request body, its environment left undecoded.

    What the daemon checks before a child takes the call, in its own loop:
    decoding a 1 MiB environment there would hold every other caller.
    Raises ValueError for a body without its three first fields.
    """
    fields = body.split(b"\0", 3)
    if len(fields) < 3:
        raise ValueError("request without version, program and working directory")
    version, program, cwd = (f.decode("utf-8", "surrogateescape") for f in fields[:3])
    return version, program, cwd


def env_value(body: bytes, key: str) -> str | None:
    """One variable of a request body's environment, as :func:`decode_request` reads it, the rest left undecoded.

    For the daemon's loop, which counts each call by its CNI command: the
    last entry of the name wins, as in the decoded environment.
    """
    env_start = 0
    for _ in range(3):
        env_start = body.find(b"\0", env_start) + 1
        if env_start == 0:
            return None
    needle = b"\0" + key.encode("utf-8", "surrogateescape") + b"="
    found = body.rfind(needle, env_start - 1)
    if found < 0:
        return None
    start = found + len(needle)
    end = body.find(b"\0", start)
    return body[start : None if end < 0 else end].decode("utf-8", "surrogateescape")


def decode_request(body: bytes) -> tuple[str, str, str, dict[str, str]]:
    """The fields of a request body.  Raises ValueError for one without its three first fields.

    An environment entry without ``=`` is left out, as the C library
    leaves it out of a process's environment; one with an empty name is
    kept (a plugin run directly sees it too).
    """
    fields = body.decode("utf-8", "surrogateescape").split("\0")
    if len(fields) < 3:
        raise ValueError("request without version, program and working directory")
    version, program, cwd, *pairs = fields
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if sep:
            env[key] = value
    return version, program, cwd, env


def exited(status: int) -> bytes:
    return bytes([EXITED, status & 0xFF])


def refused(error: bytes) -> bytes:
    """``error`` is the CNI error object, JSON, with its newline."""
    return bytes([REFUSED]) + error
