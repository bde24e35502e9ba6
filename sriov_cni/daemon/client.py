"""The Python ``sriov`` executable: hand the call to the daemon, or run it here.

On a node that has this package installed, the ``sriov`` console script is
this module. It imports only the standard library, so it can start Python
without site-packages (``-S``) and still be fast. When the sriov-cni daemon
(:mod:`sriov_cni.daemon.server`) answers, it runs the call in a warm forked
process with our stdin, stdout and stderr; otherwise, or when the daemon is
of another version, the same plugin code runs in this process. Nodes without
Python run the static shim (shim/sriov-shim.c) instead, which speaks the
same protocol; :func:`install` writes it.
"""

from __future__ import annotations

import _socket
import _struct
import os
import sys

import sriov_cni
from sriov_cni import __version__
from sriov_cni.daemon import wire

SOCKET_ENV = "SRIOV_CNI_SOCKET"
# The variable's name before the daemon served the shim; still honoured.
OLD_SOCKET_ENV = "SRIOV_CNI_HELPER_SOCKET"
DEFAULT_SOCKET = "/run/sriov-cni/plugin.sock"
# Built by `make -C shim`.
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sriov-shim")
EXECUTABLES = ("sriov", "sriov-ipam")


class ShimNotBuilt(Exception):
    """install() was asked for the shim, but this installation has none."""


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or os.environ.get(OLD_SOCKET_ENV) or DEFAULT_SOCKET


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
            conn.sendmsg(
                [frame[: wire.HEADER_SIZE]],
                [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _struct.pack("3i", 0, 1, 2))],
            )
            conn.sendall(frame[wire.HEADER_SIZE :])
            answer = _recv_answer(conn)
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
            + ' ended without an answer (did it die or restart?); the call may have partly run'
            ' and was not retried"}\n'
        )
        return 1
    # REFUSED, or a tag of a daemon of another version (which refuses the
    # call for that): nothing ran, so this installation runs it.
    return None


def _recv_answer(conn: _socket.socket) -> bytes:
    """The tag, and the status after EXITED: no more than the answer needs."""
    tag = conn.recv(1)
    if tag != bytes([wire.EXITED]):
        return tag
    return tag + conn.recv(1)


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


def install(dest: str, python: str | None = None) -> list[str]:
    """Write the CNI executables ``sriov`` and ``sriov-ipam`` into ``dest``.

    By default both are the static shim, which needs the daemon and nothing
    else on the node. With ``python`` (an interpreter path valid where they
    will run) they are scripts of this installation instead, which run in
    process when no daemon answers; ``sriov`` starts it with ``-S``:
    site-packages are loaded only when the call runs in process.
    """
    if python is None and not os.path.exists(SHIM):
        raise ShimNotBuilt(f"the shim is not built ({SHIM} is missing): run make -C shim")
    # The directory holding the sriov_cni package, first on the scripts'
    # path so they run this installation's code.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(sriov_cni.__file__)))
    scripts = {
        "sriov": (f"#!{python} -S\n", "sriov_cni.daemon.client"),
        "sriov-ipam": (f"#!{python}\n", "ipam.main"),
    }
    from sriov_cni import safepath

    # The runtime runs what is here as root: a directory others may write
    # would let them swap the executables.
    safepath.state_dir(os.path.abspath(dest), 0o755, "CNI plugin directory")
    written = []
    for name in EXECUTABLES:
        path = os.path.join(dest, name)
        if python is None:
            with open(SHIM, "rb") as f:
                content = f.read()
        else:
            shebang, module = scripts[name]
            content = (
                f"{shebang}import sys\nsys.path.insert(0, {package_root!r})\n"
                f"from {module} import main\nmain()\n"
            ).encode()
        # Replaced, not rewritten: a runtime calling the plugin meanwhile
        # runs the old file or the new, never half of one.
        safepath.replace_file(path, content, 0o755)
        written.append(path)
    return written
