"""Logging for CNI invocations: stderr or ``logFile``, never stdout (stdout is the protocol's)."""

from __future__ import annotations

import logging
import sys
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
_FORMAT = "%(asctime)s %(levelname)s sriov [%(cni_context)s] %(message)s"


def _printable(value: str) -> str:
    # A non-UTF-8 byte from the environment arrives as a lone surrogate,
    # which no stream can encode.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


class _Context(logging.Filter):
    def __init__(self, context: str) -> None:
        super().__init__()
        self.context = context

    def filter(self, record: logging.LogRecord) -> bool:
        record.cni_context = self.context
        return True


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that reports its own failures in one line, not a traceback."""

    def __init__(self, stream: IO[str], owned: bool) -> None:
        super().__init__(stream)
        self._owned = owned
        self._failed = False
        self.context = _Context("")

    def handleError(self, record: logging.LogRecord) -> None:
        # A full disk (or /dev/full) must not print a traceback per line
        # into the runtime's logs, nor fail the network setup.
        if self._failed:
            return
        self._failed = True
        try:
            sys.stderr.write(f"sriov: cannot write to the log: {sys.exc_info()[1]}\n")
        except Exception:
            pass

    def close(self) -> None:
        try:
            if self._owned:
                self.stream.close()
        except OSError:
            pass
        super().close()


def _handler(log_file: str | None) -> _Handler:
    if log_file:
        try:
            fd = safepath.open_log(log_file)
        except CNIError as exc:
            # A bad log path must not fail the network setup; say so on stderr.
            sys.stderr.write(f"sriov: {_printable(str(exc))}; logging to stderr\n")
        else:
            return _Handler(open(fd, "a", encoding="utf-8", errors="backslashreplace"), owned=True)
    return _Handler(sys.stderr, owned=False)


def configure(level: str, log_file: str | None, container_id: str, netns: str, ifname: str) -> None:
    """(Re)direct the plugin's log; every line names the container, netns and interface."""
    context = _printable(f"containerID={container_id} netns={netns} ifname={ifname}")
    current = _package.handlers[0] if len(_package.handlers) == 1 else None
    if not log_file and isinstance(current, _Handler) and current.stream is sys.stderr:
        # A call configures its log twice (from its environment, then from
        # its config); on stderr both times, the handler stays and only its
        # context changes.
        current.context.context = context
    else:
        handler = _handler(log_file)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler.addFilter(handler.context)
        handler.context.context = context
        close()
        _package.addHandler(handler)
    _package.setLevel(_LEVELS.get(level, logging.INFO))
    _package.propagate = False


def close() -> None:
    """End the log's current handlers: a call's log file is closed, not kept into the next call."""
    for handler in list(_package.handlers):
        _package.removeHandler(handler)
        handler.close()
