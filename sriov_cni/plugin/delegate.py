"""Running the configured IPAM plugin for a command.

``ipam.type`` ``"sriov-ipam"`` runs in-process (no fork, no second
interpreter start); any other type is executed from ``CNI_PATH`` with the
standard delegation rules: the same environment except ``CNI_COMMAND``, the
same stdin, its stderr passed through, its stdout parsed as a result or an
error object.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable
from dataclasses import replace

from sriov_cni.cni import CmdArgs, CNIError, Code, Result, bounded_int, decode_json, shown
from sriov_cni.kernel import lifetime

IN_PROCESS_TYPE = "sriov-ipam"


def find_plugin(name: str, path: tuple[str, ...]) -> str:
    if not name or "/" in name:
        raise CNIError(Code.INVALID_CONFIG, f"ipam.type {shown(name)} is not a plugin name")
    if not path:
        raise CNIError(Code.INVALID_ENV, f"CNI_PATH is empty, so the IPAM plugin {shown(name)} cannot be found")
    for directory in path:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise CNIError(Code.INVALID_CONFIG, f"IPAM plugin {shown(name)} not found in CNI_PATH {':'.join(path)}")


def _orphan_guard() -> Callable[[], None] | None:
    """What keeps the IPAM plugin from outliving this process.

    A runtime that gives up on a call kills the plugin and nothing else. An
    orphaned IPAM child would go on to finish its command late: a DEL that
    wakes up after the runtime's retry re-ADDed the same container releases
    the address the live pod now holds.

    The daemon's call children lead a process group of their own and are
    ended with that group (``sriov_cni.daemon.child.Watchdog``), so there nothing is
    needed. Elsewhere PR_SET_PDEATHSIG is armed in the child; it costs the
    spawn its vfork path (a fork of this process per delegated call).
    """
    if os.getpgid(0) == os.getpid():
        return None
    lifetime.load()  # here, not in the forked child
    return functools.partial(lifetime.die_with_parent, os.getpid())


class IpamCall:
    """One IPAM command, started here and answered by :meth:`result`.

    An executed plugin starts at once and runs beside this process, so ADD
    and DEL move the VF while it works (starting a Go plugin costs a node
    about as much as the move itself).  The in-process ``sriov-ipam`` runs
    in :meth:`result`.  A plugin that cannot be started is reported there
    too, so a best-effort caller has one place to collect every failure.
    """

    def __init__(self, command: str, cmd: CmdArgs, ipam_type: str) -> None:
        self._command = command
        self._cmd = cmd
        self.ipam_type = ipam_type
        self.again()

    def again(self) -> None:
        """Start the command (anew, after a failure that something since may have cured)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._outcome: Result | CNIError | None = None
        self._done = False
        if self.ipam_type != IN_PROCESS_TYPE:
            try:
                self._proc = self._start()
            except CNIError as exc:
                self._finish(exc)

    def _start(self) -> subprocess.Popen[bytes]:
        exe = find_plugin(self.ipam_type, self._cmd.path)
        env = dict(self._cmd.env)
        env["CNI_COMMAND"] = self._command
        # The config goes in whole before the plugin starts, so it never
        # waits for this process to feed a pipe.
        config = os.memfd_create("cni-config", os.MFD_CLOEXEC)
        try:
            os.write(config, self._cmd.stdin)
            os.lseek(config, 0, os.SEEK_SET)
            return subprocess.Popen([exe], stdin=config, stdout=subprocess.PIPE, env=env, preexec_fn=_orphan_guard())
        except OSError as exc:
            raise CNIError(Code.IPAM, f"cannot run IPAM plugin {exe}: {exc.strerror}") from exc
        finally:
            os.close(config)

    def _finish(self, outcome: Result | CNIError | None) -> None:
        self._outcome, self._done = outcome, True

    def result(self) -> Result | None:
        """The plugin's result for ADD (None for the other commands); raises its error."""
        if not self._done:
            try:
                self._finish(self._wait())
            except CNIError as exc:
                self._finish(exc)
        if isinstance(self._outcome, CNIError):
            raise self._outcome
        return self._outcome

    def succeeded(self) -> bool:
        try:
            self.result()
        except CNIError:
            return False
        return True

    def _wait(self) -> Result | None:
        if self._proc is None:
            from sriov_cni.ipam.main import HANDLERS

            return HANDLERS[self._command](replace(self._cmd, command=self._command))
        assert self._proc.stdout is not None
        with self._proc.stdout:
            raw = self._proc.stdout.read()
        returncode = self._proc.wait()
        return _answer(self._command, self.ipam_type, returncode, raw.decode(errors="replace").strip())


def run_ipam(command: str, cmd: CmdArgs, ipam_type: str) -> Result | None:
    """Run IPAM ``command`` to its end; returns its result for ADD, None otherwise."""
    return IpamCall(command, cmd, ipam_type).result()


def _answer(command: str, ipam_type: str, returncode: int, out: str) -> Result | None:
    """What an executed IPAM plugin's exit status and stdout say."""
    if returncode != 0:
        try:
            err = decode_json(out, "the error object")
        except CNIError:
            err = None
        if not isinstance(err, dict):
            raise CNIError(Code.IPAM, f"IPAM plugin {ipam_type} failed with status {returncode}", out[:500])
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
