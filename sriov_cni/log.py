"""Logging for CNI invocations: stderr or ``logFile``, never stdout (stdout is the protocol's)."""

from __future__ import annotations

import logging
import sys

from sriov_cni.cni import log

_LEVELS = {
    "panic": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}


def configure(level: str, log_file: str | None, container_id: str, netns: str, ifname: str) -> None:
    """(Re)direct the plugin's log; every line names the container, netns and interface."""
    fmt = logging.Formatter(
        f"%(asctime)s %(levelname)s sriov [containerID={container_id} netns={netns} ifname={ifname}] %(message)s"
    )
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if log_file:
        try:
            handler = logging.FileHandler(log_file)
        except OSError as exc:
            # A bad log path must not fail the network setup; say so on stderr.
            sys.stderr.write(f"sriov: cannot open logFile {log_file}: {exc.strerror}; logging to stderr\n")
    handler.setFormatter(fmt)
    for old in list(log.handlers):
        log.removeHandler(old)
        old.close()
    log.addHandler(handler)
    log.setLevel(_LEVELS.get(level, logging.INFO))
    log.propagate = False
