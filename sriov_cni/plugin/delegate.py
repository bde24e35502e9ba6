"""Running the configured IPAM plugin for a command.

``ipam.type`` ``"sriov-ipam"`` runs in-process (no fork, no second
interpreter start); any other type is executed from ``CNI_PATH`` with the
standard delegation rules: the same environment except ``CNI_COMMAND``, the
same stdin, its stderr passed through, its stdout parsed as a result or an
error object.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
from dataclasses import replace
from typing import Callable

from sriov_cni.cni import CmdArgs, CNIError, Code, Result, bounded_int, decode_json

IN_PROCESS_TYPE = "sriov-ipam"


def find_plugin(name: str, path: tuple[str, ...]) -> str:
    if not name or "/" in name:
        raise CNIError(Code.INVALID_CONFIG, f"ipam.type {name!r} is not a plugin name")
    if not path:
        raise CNIError(Code.INVALID_ENV, f"CNI_PATH is empty, so the IPAM plugin {name!r} cannot be found")
    for directory in path:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise CNIError(Code.INVALID_CONFIG, f"IPAM plugin {name!r} not found in CNI_PATH {':'.join(path)}")


_PR_SET_PDEATHSIG = 1


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _die_with(parent: int) -> None:
    """Runs in the IPAM plugin's child before exec: end it when ``parent`` dies."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # died before the signal was armed
        os._exit(1)


def _orphan_guard() -> Callable[[], None] | None:
    """What keeps the IPAM plugin from outliving this process.

    A runtime that gives up on a call kills the plugin and nothing else. An
    orphaned IPAM child would go on to finish its command late: a DEL that
    wakes up after the runtime's retry re-ADDed the same container releases
    the address the live pod now holds.

    The daemon's call children lead a process group of their own and are
    ended with that group (:mod:`sriov_cni.daemon.server`), so there nothing is
    needed. Elsewhere PR_SET_PDEATHSIG is armed in the child; it costs the
    spawn its vfork path (a fork of this process per delegated call).
    """
    if os.getpgid(0) == os.getpid():
        return None
    _libc()  # loaded here, not in the forked child
    return functools.partial(_die_with, os.getpid())


def run_ipam(command: str, cmd: CmdArgs, ipam_type: str) -> Result | None:
    """Run IPAM ``command``; returns its result for ADD, None otherwise."""
    if ipam_type == IN_PROCESS_TYPE:
        from ipam.main import HANDLERS

        return HANDLERS[command](replace(cmd, command=command))
    exe = find_plugin(ipam_type, cmd.path)
    env = dict(cmd.env)
    env["CNI_COMMAND"] = command
    try:
        proc = subprocess.run(
            [exe],
            input=cmd.stdin,
            env=env,
            stdout=subprocess.PIPE,
            check=False,
            preexec_fn=_orphan_guard(),
        )
    except OSError as exc:
        raise CNIError(Code.IPAM, f"cannot run IPAM plugin {exe}: {exc.strerror}") from exc
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        try:
            err = decode_json(out, "the error object")
        except CNIError:
            err = None
        if not isinstance(err, dict):
            raise CNIError(Code.IPAM, f"IPAM plugin {ipam_type} failed with status {proc.returncode}", out[:500])
        try:
            code = bounded_int(err.get("code"), "code", Code.INTERNAL)
        except ValueError:
            # Not a usable error code: report the failure as ours.
            code = Code.IPAM
        raise CNIError(
            code or Code.IPAM,
            f"IPAM plugin {ipam_type}: {str(err.get('msg') or 'failed')[:500]}",
            str(err.get("details") or "")[:500],
        )
    if command != "ADD":
        return None
    raw = decode_json(out, f"the result of IPAM plugin {ipam_type}", Code.IPAM)
    return Result.from_dict(raw, f"result of IPAM plugin {ipam_type}")
