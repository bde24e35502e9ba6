"""The daemon reads every caller's request itself, before a child takes it.

A child is a copy of the daemon, and there are at most MAX_CHILDREN of
them: a caller that connects and sends nothing, or a byte a second, must
not hold one while honest calls wait.  So the daemon accepts each
connection, checks the caller is root, and reads the whole request without
blocking, many at once, each within the request timeout; only a complete,
checked request (:class:`Call`) is handed to a child.  What a caller can
make the daemon hold is bounded too: at most ``max_pending`` connections
(the oldest one still sending makes way for a new one) and ``pending_bytes``
of requests being read (budget.Admission: a share of the daemon's memory
budget).

Every refusal is answered here, as the wire's REFUSED with a CNI error
object; the caller's descriptors are closed, and the connection once the
caller is done with it.  Nothing of a refused call ever reaches a child.
"""

from __future__ import annotations

import array
import collections
import fcntl
import json
import os
import select
import selectors
import socket
import stat
import struct
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from sriov_cni import __version__, wire
from sriov_cni.cni import CNIError, Code

_FD = array.array("i").itemsize


@dataclass
class Call:
    """A complete request from root, checked: a child may run it."""

    conn: socket.socket
    # The caller's stdin, stdout and stderr.
    fds: list[int]
    body: bytes

    def close(self) -> None:
        self.conn.close()
        for fd in self.fds:
            os.close(fd)


@dataclass
class _Reading:
    conn: socket.socket
    deadline: float
    header: bytes = b""
    fds: list[int] = field(default_factory=list)
    size: int | None = None
    body: bytearray = field(default_factory=bytearray)


def refusal_frame(refusal: CNIError) -> bytes:
    return wire.refused(json.dumps(refusal.to_dict("1.0.0")).encode() + b"\n")


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid)


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % _FD)])
    return list(fds)


_NAMES = ("stdin", "stdout", "stderr")


def _descriptor_problem(index: int, fd: int) -> str | None:
    """Why the caller's descriptor ``index`` cannot serve as its stdin/stdout/stderr; None if it can.

    The child would otherwise fail on it half-way: reading a directory,
    writing to a listening socket or a pipe nobody reads.
    """
    st = os.fstat(fd)
    kind = stat.S_IFMT(st.st_mode)
    if kind == stat.S_IFDIR:
        return "a directory"
    if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFCHR, stat.S_IFSOCK):
        return "neither a file, a pipe, a socket nor a character device"
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_PATH:
        return "opened only as a path"
    access = flags & os.O_ACCMODE
    if access != os.O_RDWR and access != (os.O_RDONLY if index == 0 else os.O_WRONLY):
        return "not open for " + ("reading" if index == 0 else "writing")
    if kind == stat.S_IFSOCK:
        sock = socket.socket(fileno=os.dup(fd))
        with sock:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return "a listening socket"
            try:
                sock.getpeername()
            except OSError:
                return "a socket connected to nothing"
    if index > 0 and kind in (stat.S_IFIFO, stat.S_IFSOCK):
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
            return "a pipe or socket nobody reads"
    return None


def check_request(body: bytes, fds: list[int], programs: Collection[str]) -> CNIError | None:
    """Why the daemon must not run this request; None if it may."""
    try:
        version, program, _ = wire.decode_head(body)
    except ValueError as exc:
        return CNIError(Code.DECODE, f"unreadable request: {exc}")
    if version != __version__:
        return CNIError(
            Code.TRY_AGAIN,
            f"version skew: the sriov-cni daemon is {__version__}, the {program} executable "
            f"is {version}; install the executables of the daemon's version "
            "(sriov-cni install-cni) or run the daemon of theirs",
        )
    if program not in programs:
        return CNIError(
            Code.INVALID_ENV,
            f"the sriov-cni daemon runs {' and '.join(sorted(programs))}, not {program!r}: "
            "install the shim under one of those names",
        )
    for index, fd in enumerate(fds):
        problem = _descriptor_problem(index, fd)
        if problem is not None:
            return CNIError(Code.DECODE, f"the caller's {_NAMES[index]} is {problem}; nothing ran")
    return None


class Intake:
    """Connections being read and complete calls waiting for a child, in the daemon's selector."""

    def __init__(
        self,
        listener: socket.socket,
        selector: selectors.BaseSelector,
        request_timeout: float,
        max_pending: int,
        pending_bytes: int,
        refused: Callable[[int], None],
        programs: Collection[str],
    ) -> None:
        """``refused``: told the CNI error code of each refusal answered here (the metrics count them); ``programs``: the names a caller may ask for."""
        self.listener = listener
        self.selector = selector
        self.timeout = request_timeout
        self.programs = programs
        self._refused = refused
        self.max_pending = max_pending
        self.max_pending_bytes = pending_bytes
        # In the order accepted: the first is the next to time out.
        self.reading: dict[int, _Reading] = {}
        self.ready: collections.OrderedDict[int, Call] = collections.OrderedDict()
        # Refused, answered, and shut for writing: each is read to its end
        # and dropped before it is closed (see _refuse).
        self.closing: dict[int, tuple[socket.socket, float]] = {}
        self.pending_bytes = 0
        self.accepting = False
        self._accept_again()

    def _accept_again(self) -> None:
        if not self.accepting:
            self.selector.register(self.listener, selectors.EVENT_READ, self._accept)
            self.accepting = True

    def _accept(self) -> None:
        while True:
            if len(self.reading) + len(self.ready) + len(self.closing) >= self.max_pending and self.closing:
                self._closed(next(iter(self.closing.values()))[0])
            full = len(self.reading) + len(self.ready) >= self.max_pending
            if full and not self.reading:
                # Every slot holds a complete call: new ones wait in the
                # listen queue until children take some.
                self.selector.unregister(self.listener)
                self.accepting = False
                return
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            uid = peer_uid(conn)
            if uid != 0:
                # Said, not just closed: a closed connection reads as a call
                # that may have partly run.
                self._refuse(
                    conn,
                    [],
                    CNIError(Code.INVALID_ENV, f"only root may call the sriov-cni daemon, not uid {uid}; nothing ran"),
                )
                continue
            if full:
                # An honest request comes whole at once: the oldest one still
                # being read is the likeliest to be stalled.
                self._drop(
                    next(iter(self.reading.values())),
                    CNIError(
                        Code.TRY_AGAIN,
                        "the sriov-cni daemon is reading too many requests at once, "
                        "and this one was the oldest; nothing ran",
                    ),
                )
            conn.setblocking(False)
            reading = _Reading(conn, time.monotonic() + self.timeout)
            self.reading[conn.fileno()] = reading
            self.selector.register(conn, selectors.EVENT_READ, lambda r=reading: self._read(r))

    def _refuse(self, conn: socket.socket, fds: list[int], refusal: CNIError) -> None:
        """Answer without waiting (the caller reads nothing before it), then let the caller go.

        Closed at once, a connection with unread bytes (the rest of a
        refused request) would reset the caller's, which then reads an
        error and no answer, as if the call had partly run.  So the answer
        is followed by the end of the stream, and what the caller still
        sends is read and dropped until it closes (or the request timeout).
        """
        self._refused(refusal.code)
        for fd in fds:
            os.close(fd)
        try:
            conn.setblocking(False)
            conn.send(refusal_frame(refusal))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()  # gone, or not reading: it learns nothing more from us either way
            return
        self.closing[conn.fileno()] = (conn, time.monotonic() + self.timeout)
        self.selector.register(conn, selectors.EVENT_READ, lambda: self._drain(conn))

    def _drain(self, conn: socket.socket) -> None:
        try:
            while conn.recv(1 << 16):
                pass
        except BlockingIOError:
            return
        except OSError:
            pass
        self._closed(conn)

    def _closed(self, conn: socket.socket) -> None:
        del self.closing[conn.fileno()]
        self.selector.unregister(conn)
        conn.close()

    def _drop(self, reading: _Reading, refusal: CNIError | None) -> None:
        del self.reading[reading.conn.fileno()]
        self.selector.unregister(reading.conn)
        if reading.size is not None:
            self.pending_bytes -= reading.size
        if refusal is None:
            Call(reading.conn, reading.fds, b"").close()
        else:
            self._refuse(reading.conn, reading.fds, refusal)

    def _read(self, r: _Reading) -> None:
        try:
            refusal = self._read_more(r)
        except BlockingIOError:
            return
        except OSError:
            self._drop(r, None)
            return
        if refusal is not None:
            self._drop(r, refusal)
        elif r.size is not None and len(r.body) == r.size:
            self._complete(r)

    def _read_more(self, r: _Reading) -> CNIError | None:
        """Read what has come; why the request is refused once that is known."""
        if r.size is None:
            msg, ancdata, flags, _ = r.conn.recvmsg(
                wire.HEADER_SIZE - len(r.header), socket.CMSG_SPACE(wire.DESCRIPTORS * _FD)
            )
            r.fds += _received_fds(ancdata)
            if not msg:
                return CNIError(Code.DECODE, "truncated request: no complete length")
            r.header += msg
            if len(r.fds) > wire.DESCRIPTORS or flags & socket.MSG_CTRUNC:
                return CNIError(Code.DECODE, "malformed request: more than three descriptors")
            if len(r.header) < wire.HEADER_SIZE:
                return None
            if len(r.fds) != wire.DESCRIPTORS:
                return CNIError(Code.DECODE, "malformed request: the length came without three descriptors")
            size = wire.request_size(r.header)
            if size > wire.MAX_REQUEST:
                return CNIError(
                    Code.INVALID_ENV,
                    f"the request's environment and working directory take {size} bytes, "
                    f"more than the {wire.MAX_REQUEST} the sriov-cni daemon accepts",
                )
            if self.pending_bytes + size > self.max_pending_bytes:
                return CNIError(
                    Code.TRY_AGAIN,
                    f"the sriov-cni daemon is reading {self.pending_bytes} bytes of other requests; nothing ran",
                )
            self.pending_bytes += size
            r.size = size
            if size == 0:
                return None
        chunk = r.conn.recv(min(1 << 16, r.size - len(r.body)))
        if not chunk:
            return CNIError(Code.DECODE, "truncated request")
        r.body += chunk
        return None

    def _complete(self, r: _Reading) -> None:
        del self.reading[r.conn.fileno()]
        assert r.size is not None
        self.pending_bytes -= r.size
        self.selector.unregister(r.conn)
        refusal = check_request(bytes(r.body), r.fds, self.programs)
        if refusal is not None:
            self._refuse(r.conn, r.fds, refusal)
            return
        call = Call(r.conn, r.fds, bytes(r.body))
        self.ready[r.conn.fileno()] = call
        # A caller that gives up while its call waits for a child is
        # forgotten, rather than run for no one.
        self.selector.register(r.conn, selectors.EVENT_READ, lambda: self._waiting_caller_stirs(call))

    def _waiting_caller_stirs(self, call: Call) -> None:
        self.selector.unregister(call.conn)
        try:
            gone = call.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except OSError:
            gone = True
        if gone:
            del self.ready[call.conn.fileno()]
            call.close()
            self._accept_again()
        # Bytes past the request: the child ignores them; no longer watched.

    def next_deadline(self) -> float | None:
        deadlines = [next(iter(self.reading.values())).deadline] if self.reading else []
        if self.closing:
            deadlines.append(next(iter(self.closing.values()))[1])
        return min(deadlines, default=None)

    def expire(self, now: float) -> None:
        while self.closing:
            conn, deadline = next(iter(self.closing.values()))
            if deadline > now:
                break
            self._closed(conn)
        while self.reading:
            oldest = next(iter(self.reading.values()))
            if oldest.deadline > now:
                return
            self._drop(oldest, CNIError(Code.TRY_AGAIN, f"no complete request within {self.timeout:g} s"))

    def take(self) -> Call | None:
        """The oldest complete call, now the caller's to hand to a child."""
        if not self.ready:
            return None
        fd, call = self.ready.popitem(last=False)
        if fd in self.selector.get_map():
            self.selector.unregister(call.conn)
        self._accept_again()
        return call

    def put_back(self, call: Call) -> None:
        """``call``, taken, again the first to take."""
        self.ready[call.conn.fileno()] = call
        self.ready.move_to_end(call.conn.fileno(), last=False)

    def refuse_waiting(self, refusal: CNIError) -> None:
        while (call := self.take()) is not None:
            self._refuse(call.conn, call.fds, refusal)
