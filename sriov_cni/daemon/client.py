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

SOCKET_ENV = "SRIOV_CNI_SOCKET"
# The variable's name before the daemon served the shim; still honoured.
OLD_SOCKET_ENV = "SRIOV_CNI_HELPER_SOCKET"
DEFAULT_SOCKET = "/run/sriov-cni/plugin.sock"
# The daemon's answer when it ran nothing; a CNI error object follows.
REFUSED = 255
# Built by `make -C shim`.
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sriov-shim")
EXECUTABLES = ("sriov", "sriov-ipam")


class ShimNotBuilt(Exception):
    """install() was asked for the shim, but this installation has none."""

# The daemon path must start faster than the work it saves, so this module
# avoids even json and socket (they pull in re, enum and selectors): the
# request is "version NUL program NUL cwd NUL KEY=VALUE NUL ...", after a
# 4-byte length.


def encode_request(version: str, program: str, cwd: str, env: dict[str, str]) -> bytes:
    fields = [version, program, cwd] + [f"{k}={v}" for k, v in env.items()]
    return "\0".join(fields).encode("utf-8", "surrogateescape")


def decode_request(data: bytes) -> tuple[str, str, str, dict[str, str]]:
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    if len(fields) < 3:
        raise ValueError("request without version, program and working directory")
    version, program, cwd, *pairs = fields
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if sep:
            env[key] = value
    return version, program, cwd, env


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or os.environ.get(OLD_SOCKET_ENV) or DEFAULT_SOCKET


def via_daemon(path: str) -> int | None:
    """The plugin's exit status as run by the daemon; None when it did not run it."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            conn.connect(path)
        except OSError:
            return None
        body = encode_request(__version__, "sriov", os.getcwd(), dict(os.environ))
        try:
            conn.sendmsg(
                [_struct.pack("!I", len(body))],
                [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _struct.pack("3i", 0, 1, 2))],
            )
            conn.sendall(body)
            answer = conn.recv(1)
        except OSError:
            answer = b""
    finally:
        conn.close()
    if not answer:
        # The daemon took the call and died without an answer: the plugin
        # may have run, so running it again here could double an ADD.
        sys.stdout.write(
            '{"cniVersion": "1.0.0", "code": 11, "msg": "the sriov-cni daemon at '
            + path.replace("\\", "\\\\").replace('"', '\\"')
            + ' ended without an answer (did it die or restart?); the call may have partly run'
            ' and was not retried"}\n'
        )
        return 1
    return None if answer[0] == REFUSED else answer[0]


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
    import shutil  # not at the top: it costs every call of the executable

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
        # Written beside the target and renamed over it: a runtime calling
        # the plugin meanwhile runs the old file or the new, never half of one.
        tmp = f"{path}.tmp{os.getpid()}"
        if python is None:
            shutil.copyfile(SHIM, tmp)
        else:
            shebang, module = scripts[name]
            with open(tmp, "w") as f:
                f.write(
                    f"{shebang}import sys\nsys.path.insert(0, {package_root!r})\n"
                    f"from {module} import main\nmain()\n"
                )
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
        written.append(path)
    return written
