"""The ``sriov`` executable: hand the call to the warm helper, or run it here.

This module imports only the standard library, so the executable can start
Python without site-packages (``-S``) and still be fast.  When the helper
(:mod:`sriov_cni.server`) answers, it runs the call in a warm forked process
with our stdin, stdout and stderr; otherwise, or when the helper is of
another version, the same plugin code runs in this process.
"""

from __future__ import annotations

import _socket
import _struct
import os
import sys

from sriov_cni import __version__

SOCKET_ENV = "SRIOV_CNI_HELPER_SOCKET"
DEFAULT_SOCKET = "/run/sriov-cni/plugin.sock"
FALLBACK = 255

# The helper path must start faster than the work it saves, so this module
# avoids even json and socket (they pull in re, enum and selectors): the
# request is "version NUL cwd NUL KEY=VALUE NUL ...", after a 4-byte length.


def encode_request(version: str, cwd: str, env: dict[str, str]) -> bytes:
    fields = [version, cwd] + [f"{k}={v}" for k, v in env.items()]
    return "\0".join(fields).encode("utf-8", "surrogateescape")


def decode_request(data: bytes) -> tuple[str, str, dict[str, str]]:
    version, cwd, *pairs = data.decode("utf-8", "surrogateescape").split("\0")
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if sep:
            env[key] = value
    return version, cwd, env


def via_helper(path: str) -> int | None:
    """The plugin's exit status as run by the helper; None when it did not run it."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            conn.connect(path)
        except OSError:
            return None
        body = encode_request(__version__, os.getcwd(), dict(os.environ))
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
        # The helper took the call and died without an answer: the plugin
        # may have run, so running it again here could double an ADD.
        sys.stdout.write(
            '{"cniVersion": "1.0.0", "code": 999, "msg": "the sriov-cni helper ended without an answer"}\n'
        )
        return 1
    return None if answer[0] == FALLBACK else answer[0]


def in_process() -> None:
    if sys.flags.no_site:
        import site

        site.main()
    from sriov_cni import plugin

    plugin.main()


def main() -> None:
    status = via_helper(os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)
    if status is None:
        in_process()
    sys.exit(status)


def install(dest: str, python: str | None = None) -> list[str]:
    """Write CNI executables into ``dest`` (e.g. /opt/cni/bin) for this package.

    ``python`` is the interpreter the executables run with, as a path valid
    where they will run (default: this one).  ``sriov`` starts it with
    ``-S``: site-packages are loaded only when the call runs in process, not
    when the helper serves it.
    """
    python = python or sys.executable
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    scripts = {
        "sriov": (f"#!{python} -S\n", "sriov_cni.client"),
        "sriov-ipam": (f"#!{python}\n", "ipam.main"),
    }
    written = []
    os.makedirs(dest, exist_ok=True)
    for name, (shebang, module) in scripts.items():
        path = os.path.join(dest, name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(
                f"{shebang}import sys\nsys.path.insert(0, {package_root!r})\n"
                f"from {module} import main\nmain()\n"
            )
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
        written.append(path)
    return written
