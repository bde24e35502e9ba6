"""Logging for CNI invocations of both executables: stderr or ``logFile``, never stdout (stdout is the protocol's).

One line format for ``sriov`` and ``sriov-ipam``: an RFC 3339 time with
the zone, the level, the executable and the call's context, so that a
node's lines from both read and sort alike.
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Mapping
from typing import IO

from sriov_cni import safepath
from sriov_cni.cni import CNIError

# The package's logger: every module logs to its own (``logging.getLogger(__name__)``),
# below this one, which holds the call's handler and level.
_package = logging.getLogger("sriov_cni")

_LEVELS = {
    "panic": logging.CRITICAL,
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}

# The invocation's context is a field filled in as data: put into the
# pattern itself, CNI_IFNAME=net%d made every line a formatting error.
_FORMAT = "%(asctime)s %(levelname)s %(cni_program)s [%(cni_context)s] %(message)s"


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # RFC 3339 with the local zone's offset: 2026-11-28T08:41:02.123+01:00.
        return datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")


def _printable(value: str) -> str:
    # A non-UTF-8 byte from the environment arrives as a lone surrogate,
    # which no stream can encode.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


class _Context(logging.Filter):
    def __init__(self, program: str, context: str) -> None:
        super().__init__()
        self.program = program
        self.context = context

    def filter(self, record: logging.LogRecord) -> bool:
        record.cni_program = self.program
        record.cni_context = self.context
        return True


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that reports its own failures in one line, not a traceback."""

    def __init__(self, stream: IO[str], owned: bool) -> None:
        super().__init__(stream)
        self._owned = owned
        self._failed = False
        self.context = _Context("", "")

    def handleError(self, record: logging.LogRecord) -> None:
        # A full disk (or /dev/full) must not print a traceback per line
        # into the runtime's logs, nor fail the network setup.
        if self._failed:
            return
        self._failed = True
        try:
            sys.stderr.write(f"{self.context.program}: cannot write to the log: {sys.exc_info()[1]}\n")
        except Exception:
            pass

    def close(self) -> None:
        try:
            if self._owned:
                self.stream.close()
        except OSError:
            pass
        super().close()


def _handler(program: str, log_file: str | None) -> _Handler:
    if log_file:
        try:
            fd = safepath.open_log(log_file)
        except CNIError as exc:
            # A bad log path must not fail the network setup; say so on stderr.
            sys.stderr.write(f"{program}: {_printable(str(exc))}; logging to stderr\n")
        else:
            return _Handler(open(fd, "a", encoding="utf-8", errors="backslashreplace"), owned=True)
    return _Handler(sys.stderr, owned=False)


def configure(program: str, level: str, log_file: str | None, container_id: str, netns: str, ifname: str) -> None:
    """(Re)direct the log of executable ``program``; every line names the container, netns and interface."""
    context = _printable(f"containerID={container_id} netns={netns} ifname={ifname}")
    current = _package.handlers[0] if len(_package.handlers) == 1 else None
    if not log_file and isinstance(current, _Handler) and current.stream is sys.stderr:
        # A call configures its log twice (from its environment, then from
        # its config); on stderr both times, the handler stays and only its
        # context changes.
        current.context.program, current.context.context = program, context
    else:
        handler = _handler(program, log_file)
        handler.setFormatter(_Formatter(_FORMAT))
        handler.addFilter(handler.context)
        handler.context.program, handler.context.context = program, context
        close()
        _package.addHandler(handler)
    _package.setLevel(_LEVELS.get(level, logging.INFO))
    _package.propagate = False


def configure_from_env(program: str, env: Mapping[str, str]) -> None:
    """Logging at info on stderr, until the config says otherwise (it names logLevel and logFile)."""
    configure(
        program, "info", None, env.get("CNI_CONTAINERID", "-"), env.get("CNI_NETNS", "-"), env.get("CNI_IFNAME", "-")
    )


def close() -> None:
    """End the log's current handlers: a call's log file is closed, not kept into the next call."""
    for handler in list(_package.handlers):
        _package.removeHandler(handler)
        handler.close()
