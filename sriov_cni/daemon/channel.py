"""Between the daemon and each of its children: the call handed over, the child's reports back.

:mod:`wire` is what an executable and the daemon say; this is what the
daemon and a child it forked say, in three ways:

- *ready*: a child writes its pid on the daemon's messages pipe each time it
  waits for a call (:func:`say_ready`, :func:`ready_pids`), one write,
  atomic in a pipe;
- *the hand-over*: the daemon sends a call on the child's own channel, a
  SOCK_SEQPACKET pair (:func:`hand_over`, :func:`take_over`), or closes the
  channel to end the child;
- *the report*: once it answered its caller, and before it says it is
  ready again, the child sends a :class:`Report` of the call on its channel
  (the CNI error code its caller read, the seconds from taking the call to
  the answer, the VF claims it found held, and the memory it alone holds
  now), which the daemon reads as :class:`Reported` (:func:`reports`) for
  its metrics and its memory budget's cap.

A child may be SIGKILLed at any point (by its watchdog when its caller
hangs up, or by the OOM killer), so it keeps nothing the daemon needs:
whatever it did not report, the daemon knows from having handed the call.
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from sriov_cni.daemon import wire
from sriov_cni.daemon.intake import Call

# Bytes of a call's stdout kept to read its error code from: an error object
# is a few hundred; a longer output is a result, and its status 0.
KEEP = 1 << 16
_PID = "=i"


def say_ready(messages: int) -> None:
    """In a child: it waits for a call now (its pid on the daemon's ``messages`` pipe)."""
    os.write(messages, struct.pack(_PID, os.getpid()))


def ready_pids(messages: int) -> list[int]:
    """In the daemon: the children that said they wait for a call since it last read ``messages``."""
    data = os.read(messages, struct.calcsize(_PID) * 64)
    return [pid for (pid,) in struct.iter_unpack(_PID, data)]


# The hand-over: one message carrying the connection, the caller's three
# descriptors and a memfd holding the request body (up to MAX_REQUEST, more
# than a datagram holds).


def hand_over(channel: socket.socket, call: Call) -> None:
    """Send ``call`` to the child at the other end of ``channel``, and close it here.

    Raises OSError, with ``call`` still open, when the child is gone.
    """
    body = os.memfd_create("sriov-cni-request", os.MFD_CLOEXEC)
    try:
        with open(body, "wb", closefd=False) as f:
            f.write(call.body)
        socket.send_fds(channel, [b"c"], [call.conn.fileno(), *call.fds, body], socket.MSG_DONTWAIT)
    finally:
        os.close(body)
    call.close()


def take_over(channel: socket.socket) -> Call | None:
    """The call the daemon handed to this child; None when the daemon closed the channel."""
    msg, fds, _, _ = socket.recv_fds(channel, 1, wire.DESCRIPTORS + 2)
    if not msg:
        return None
    conn, *caller, body = fds
    try:
        # At offset 0: the daemon's writes moved the offset this copy shares.
        data = os.pread(body, os.fstat(body).st_size, 0)
    finally:
        os.close(body)
    return Call(socket.socket(fileno=conn), caller, data)


class _Tee(io.RawIOBase):
    """A descriptor written through, keeping the first KEEP bytes written."""

    def __init__(self, fd: int, kept: bytearray) -> None:
        super().__init__()
        self._fd = fd
        self._kept = kept

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        written = os.write(self._fd, data)
        room = KEEP - len(self._kept)
        if room > 0:
            self._kept += bytes(memoryview(data)[: min(written, room)])
        return written


class Report:
    """What a child tells the daemon about the call it took: made as it takes it, sent once answered."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._seconds = 0.0
        self._result = ""
        self._out = bytearray()
        self._claims_refused = 0
        self._private = 0
        # Whether the call was refused, nothing of it run.
        self.refusal = False

    def stdout(self) -> IO[str]:
        """The caller's stdout (descriptor 1), as ``open(1, "w")`` would give it, keeping what the call writes."""
        return io.TextIOWrapper(io.BufferedWriter(_Tee(1, self._out)))

    def exited(self, status: int) -> None:
        """The call ran, and its exit status goes to the caller now."""
        self._seconds = time.monotonic() - self._start
        self._result = "0" if status == 0 else self._error_code()

    def refused(self, code: int) -> None:
        """Nothing ran: the caller gets a refusal with ``code``."""
        self._seconds = time.monotonic() - self._start
        self._result = str(code)
        self.refusal = True

    def _error_code(self) -> str:
        """The code of the CNI error object the call wrote, as its caller reads it."""
        try:
            code = json.loads(self._out).get("code")
        except (ValueError, AttributeError):
            code = None
        return str(code) if isinstance(code, int) and 0 <= code < 1000 else "unknown"

    def claims_refused(self, count: int) -> None:
        """The VF claims the call found held by another call (measure.ClaimTimes)."""
        self._claims_refused = count

    def held(self, private: int) -> None:
        """The bytes the child alone holds after the call (budget.private_bytes)."""
        self._private = private

    def send(self, channel: socket.socket) -> None:
        message = {
            "result": self._result,
            "seconds": self._seconds,
            "claimsRefused": self._claims_refused,
            "privateBytes": self._private,
        }
        try:
            channel.send(json.dumps(message).encode())
        except OSError:
            pass  # the daemon is gone: nobody counts any more


@dataclass(frozen=True)
class Reported:
    """A child's :class:`Report` of one call, as the daemon read it."""

    # The CNI error code the caller got ("0": success, "unknown": unreadable).
    result: str
    seconds: float
    claims_refused: int
    # What the child alone held after the call: the daemon's cap follows the most.
    private_bytes: int


def reports(channel: socket.socket) -> Iterator[Reported]:
    """The reports a child sent on ``channel`` that the daemon has not read yet."""
    while True:
        try:
            message = channel.recv(4096, socket.MSG_DONTWAIT)
        except OSError:
            # Nothing more (EAGAIN), or closed here already: the daemon
            # closes the channel of a waiting child to end it, and such a
            # child has no call to report on.
            return
        if not message:
            return
        raw = json.loads(message)
        yield Reported(str(raw["result"]), float(raw["seconds"]), int(raw["claimsRefused"]), int(raw["privateBytes"]))
