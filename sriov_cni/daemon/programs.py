"""What the daemon runs: the programs the CNI executables stand for, by their names.

A child that has become its caller (:mod:`call`) runs one of them with the
caller's environment, its stdin read to the end, and its stdout and stderr:
exactly the code the executable would run in process, on the node the
daemon was started for (:class:`Host`).  What it returns is the
executable's exit status.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO

from sriov_cni.paths import Paths
from sriov_cni.vfstore import Store


@dataclass(frozen=True)
class Host:
    """What a call acts on: the node's paths, and the VF store it opens (the daemon times its claims)."""

    paths: Paths
    store: Callable[[str], Store]


Program = Callable[[Mapping[str, str], bytes, IO[str], IO[str], Host], int]


def _run_sriov(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str], host: Host) -> int:
    from sriov_cni import log
    from sriov_cni.plugin import commands

    log.configure_from_env(commands.PROGRAM, env)
    try:
        return commands.run(env, stdin, stdout, stderr, commands.Deps(paths=host.paths, store=host.store))
    finally:
        # The child serves other calls after this one (options.CALLS_PER_CHILD).
        log.close()


def _run_ipam(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str], host: Host) -> int:
    from sriov_cni import log
    from sriov_cni.cni import dispatch
    from sriov_cni.ipam import main as ipam_main

    log.configure_from_env(ipam_main.PROGRAM, env)
    try:
        return dispatch(ipam_main.HANDLERS, env, stdin, stdout, stderr, ipam_main.ABOUT)
    finally:
        log.close()


PROGRAMS: dict[str, Program] = {"sriov": _run_sriov, "sriov-ipam": _run_ipam}
