"""The Python ``sriov`` executable: hand the call to the daemon, or run it here.

On a node that has this package installed, the ``sriov`` console script is
this module. It imports only the standard library, so it can start Python
without site-packages (``-S``) and still be fast. When the sriov-cni daemon
(:mod:`sriov_cni.daemon.server`) answers, it runs the call in a warm forked
process with our stdin, stdout and stderr; otherwise, or when the daemon is
of another version, the same plugin code runs in this process. Nodes without
Python run the static shim (shim/sriov-shim.c) instead, which speaks the
same protocol; ``sriov-cni install-cni`` (:mod:`install`) writes either.
"""

from __future__ import annotations

import _socket
import _struct
import os
import sys

from sriov_cni import __version__, wire

SOCKET_ENV = "SRIOV_CNI_SOCKET"
DEFAULT_SOCKET = "/run/sriov-cni/plugin.sock"


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def via_daemon(path: str) -> int | None:
    """The plugin's exit status as run by the daemon; None when it did not run it."""
    # The daemon path must start faster than the work it saves, so this
    # module avoids even json and socket (they pull in re, enum and selectors).
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        # Linux applies the send timeout to a Unix stream connect: it bounds
        # the wait when the daemon's listen queue is full or it is stopped.
        conn.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, _struct.pack("ll", wire.CONNECT_TIMEOUT, 0))
        try:
            conn.connect(path)
        except OSError:
            return None
        frame = wire.encode_request(__version__, "sriov", os.getcwd(), dict(os.environ))
        try:
            # Connected: the call waits for the daemon like any running call.
            conn.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, _struct.pack("ll", 0, 0))
            answer = wire.exchange(conn, frame, (0, 1, 2))
        except OSError:
            answer = b""
    finally:
        conn.close()
    if len(answer) == 2 and answer[0] == wire.EXITED:
        return answer[1]
    if answer[:1] == bytes([wire.EXITED]) or not answer:
        # The daemon took the call and died without an answer: the plugin
        # may have run, so running it again here could double an ADD.
        sys.stdout.write(
            '{"cniVersion": "1.0.0", "code": 11, "msg": "the sriov-cni daemon at '
            + path.replace("\\", "\\\\").replace('"', '\\"')
            + " ended without an answer (did it die or restart?); the call may have partly run"
            ' and was not retried"}\n'
        )
        return 1
    # REFUSED, or a tag of a daemon of another version (which refuses the
    # call for that): nothing ran, so this installation runs it.
    return None


def in_process() -> None:
    if sys.flags.no_site:
        import site

        site.main()
    from sriov_cni.plugin import commands

    commands.main()


def main() -> None:
    status = via_daemon(socket_path())
    if status is None:
        in_process()
    sys.exit(status)
