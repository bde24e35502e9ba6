"""The warm helper: a node-local fork server for the ``sriov`` plugin.

Starting Python and importing pyroute2 costs more than everything a CNI
call then does.  The helper pays that once: it imports the plugin, listens
on a Unix socket, and for each request forks a child that takes over the
caller's stdin, stdout and stderr (passed as file descriptors) and its
environment, then runs exactly :func:`sriov_cni.plugin.run`, the same code
the executable runs in-process when no helper is there.  The child's exit
status goes back to the caller, which exits with it.

Only root may connect (checked with SO_PEERCRED).  A request from a client
of another version is refused, and the client falls back to running in
process, so an upgraded package is never served by old code.
"""

from __future__ import annotations

import array
import os
import signal
import socket
import struct
import sys

from sriov_cni import __version__
from sriov_cni.client import DEFAULT_SOCKET, FALLBACK, decode_request

MAX_HEADER = 1 << 20


def _recv_request(conn: socket.socket) -> tuple[tuple[str, str, dict[str, str]], list[int]]:
    fds = array.array("i")
    msg, ancdata, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(msg) != 4 or len(fds) != 3:
        raise ValueError("malformed request")
    (size,) = struct.unpack("!I", msg)
    if size > MAX_HEADER:
        raise ValueError("request header too large")
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    return decode_request(body), list(fds)


def _become_caller(conn: socket.socket) -> dict[str, str] | None:
    """Take over the caller's descriptors, environment and directory; None: refuse."""
    (version, cwd, env), fds = _recv_request(conn)
    if version != __version__:
        return None
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    try:
        os.chdir(cwd or "/")
    except OSError:
        os.chdir("/")
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    return env


def _serve_one(conn: socket.socket) -> None:
    """Runs in the forked child."""
    from sriov_cni import plugin

    try:
        env = _become_caller(conn)
    except (OSError, ValueError):
        env = None
    if env is None:
        # Nothing has run yet, so the caller can safely run it itself.
        conn.sendall(bytes([FALLBACK]))
        return
    plugin.configure_logging_from_env(env)
    code = plugin.run(env, sys.stdin.buffer.read(), sys.stdout, sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    conn.sendall(bytes([code & 0xFF]))


def _peer_is_root(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == 0)


def _reap(_signum: int, _frame: object) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(path: str = DEFAULT_SOCKET) -> None:
    """Listen on ``path`` until terminated."""
    # Import everything a request needs now, in the parent, so each child
    # starts warm.
    import ipam.main  # noqa: F401
    import sriov_cni.plugin  # noqa: F401

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    listener.listen(128)
    signal.signal(signal.SIGCHLD, _reap)
    sys.stderr.write(f"sriov-cni helper {__version__} listening on {path}\n")
    sys.stderr.flush()
    while True:
        try:
            conn, _ = listener.accept()
        except InterruptedError:
            continue
        if not _peer_is_root(conn):
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            status = 0
            try:
                _serve_one(conn)
            except BaseException:  # the child must always reach _exit
                status = 1
            os._exit(status)
        conn.close()


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SOCKET
    serve(path)


if __name__ == "__main__":
    main()
