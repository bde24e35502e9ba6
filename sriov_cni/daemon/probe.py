"""Whether the daemon serves calls: one real call on its socket (``sriov-cni ready``).

A socket that accepts proves little: a daemon whose children cannot start,
or whose loop is stuck, still has its listen queue.  So the probe makes the
call a shim makes, a CNI VERSION of the ``sriov`` executable, with its own
pipes as stdin, stdout and stderr: the daemon reads and checks the request,
hands it to a child, the child runs the plugin's dispatch and answers with
the exit status, and the plugin's output comes back on the pipe.  VERSION
touches no VF, record or address.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time

from sriov_cni import __version__, wire

# Seconds the whole call may take; a warm daemon answers in milliseconds.
TIMEOUT = 5.0
_CONFIG = b'{"cniVersion": "1.0.0"}'


def probe(path: str, timeout: float = TIMEOUT) -> str | None:
    """None when the daemon at ``path`` ran the call and answered within ``timeout`` seconds; else why not."""
    deadline = time.monotonic() + timeout
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        os.write(stdin_w, _CONFIG)  # far below a pipe's capacity
        os.close(stdin_w)
        stdin_w = -1
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with conn:
            try:
                answer = _call(conn, path, deadline, (stdin_r, out_w, err_w))
            except TimeoutError:
                return f"the daemon at {path} did not answer within {timeout:g} s"
            except OSError as exc:
                return f"no daemon answers at {path}: {exc.strerror or exc}"
        if not answer:
            return f"the daemon at {path} closed the connection without an answer"
        if answer[0] == wire.REFUSED:
            return f"the daemon at {path} refused the call: {_message(answer[1:])}"
        if answer[0] != wire.EXITED or len(answer) != 2:
            return f"the daemon at {path} sent an answer this probe does not read: {answer[:16]!r}"
        # The child flushed both before it answered; what they hold is all.
        out, err = _pending(out_r), _pending(err_r)
        if answer[1] != 0:
            return f"the call ran and exited {answer[1]}: {(out + err).decode(errors='replace').strip()}"
        try:
            versions = json.loads(out)["supportedVersions"]
        except (ValueError, KeyError, TypeError):
            return f"the call ran but printed no CNI version result: {out.decode(errors='replace')!r}"
        if not isinstance(versions, list) or not versions:
            return f"the call ran but named no supported versions: {out.decode(errors='replace')!r}"
        return None
    finally:
        for fd in (stdin_r, stdin_w, out_r, out_w, err_r, err_w):
            if fd >= 0:
                os.close(fd)


def _call(conn: socket.socket, path: str, deadline: float, fds: tuple[int, int, int]) -> bytes:
    """The call an executable makes (:func:`wire.exchange`), with ``fds`` attached; each step within what is left of the time."""
    frame = wire.encode_request(__version__, "sriov", "/", {"CNI_COMMAND": "VERSION"})
    conn.settimeout(max(0.001, deadline - time.monotonic()))
    conn.connect(path)
    conn.settimeout(max(0.001, deadline - time.monotonic()))
    return wire.exchange(conn, frame, fds)


def _pending(fd: int) -> bytes:
    """What the pipe holds now, without waiting for its writers to close it."""
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def _message(error: bytes) -> str:
    try:
        return str(json.loads(error)["msg"])
    except (ValueError, KeyError, TypeError):
        return error.decode(errors="replace").strip()
