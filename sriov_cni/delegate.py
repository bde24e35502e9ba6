"""Running the configured IPAM plugin for a command.

``ipam.type`` ``"sriov-ipam"`` runs in-process (no fork, no second
interpreter start); any other type is executed from ``CNI_PATH`` with the
standard delegation rules: the same environment except ``CNI_COMMAND``, the
same stdin, its stderr passed through, its stdout parsed as a result or an
error object.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace

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


def run_ipam(command: str, cmd: CmdArgs, ipam_type: str) -> Result | None:
    """Run IPAM ``command``; returns its result for ADD, None otherwise."""
    if ipam_type == IN_PROCESS_TYPE:
        from ipam.main import HANDLERS

        return HANDLERS[command](replace(cmd, command=command))
    exe = find_plugin(ipam_type, cmd.path)
    env = dict(cmd.env)
    env["CNI_COMMAND"] = command
    try:
        proc = subprocess.run([exe], input=cmd.stdin, env=env, stdout=subprocess.PIPE, check=False)
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
