"""The daemon against callers that do not follow the protocol, and a broken install.

Each test runs the real daemon and sends it, over its socket, what a
hostile or broken caller could: frames cut short, lengths out of range, a
wrong version, missing or wrong descriptors, odd environment entries,
callers that send nothing, a thousand at once, callers that leave before
the answer.  Each is answered with a refusal (a CNI error object, nothing
run) or has its connection dropped; the daemon keeps serving honest calls,
and holds no more descriptors, children or memory than before.
"""

from __future__ import annotations

import array
import itertools
import json
import os
import random
import re
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from sriov_cni import __version__, wire
from sriov_cni.daemon import childpool, server
from tests.support.daemonlib import Daemon, broken_children, ipam_conf, ipam_env, shim, wait_for

VERSION_CONF = b'{"cniVersion": "1.0.0"}'


def test_children_that_end_at_start_are_forked_again_only_after_a_while(tmp_path: Path) -> None:
    # A node where every child fails as it starts.
    d = Daemon(tmp_path / "run", wrapper=broken_children(tmp_path))
    assert d.proc.stderr is not None
    try:
        # The daemon's own warning (an OOM exemption it may not be allowed
        # to set) may come first.
        lines = list(
            itertools.islice(
                (
                    line
                    for line in iter(d.proc.stderr.readline, "")
                    if not line.startswith("sriov-cni daemon: warning: cannot exempt")
                ),
                4,
            )
        )
        # Logged once each, every fork after a doubled interval: not a
        # fork loop.
        for line in lines:
            assert "a child ended before it could take calls (exit status 1" in line, lines
        found = [re.search(r"the next fork in ([0-9.]+) s", line) for line in lines]
        assert [float(m.group(1)) for m in found if m] == [0.5, 1.0, 2.0, 4.0], lines
        # Meanwhile a call is told why, and that nothing ran.
        rc, out = shim(d.socket, "VERSION", VERSION_CONF)
        assert rc == 1 and out["code"] == 11, out
        assert "children end before they can take calls (exit status 1" in out["msg"]
        # Repaired, the daemon serves again after its current interval.
        subprocess.run(["nsenter", "--mount", "--target", str(d.proc.pid), "umount", "/dev/null"], check=True)
        rc, out = 1, {}
        while rc:
            rc, out = shim(d.socket, "VERSION", VERSION_CONF)
            assert rc == 0 or out["code"] == 11, out
        assert out["cniVersion"] == "1.0.0"
    finally:
        d.stop()


@pytest.fixture(autouse=True)
def many_descriptors() -> None:
    """Room for this process's end of a thousand connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8192 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (8192, hard))


@pytest.fixture
def stdin_file(tmp_path: Path) -> Iterator[int]:
    path = tmp_path / "stdin.json"
    path.write_bytes(VERSION_CONF)
    fd = os.open(path, os.O_RDONLY)
    yield fd
    os.close(fd)


@pytest.fixture
def devnull() -> Iterator[int]:
    fd = os.open(os.devnull, os.O_WRONLY)
    yield fd
    os.close(fd)


def frame(version: str = __version__, program: str = "sriov-ipam", env: dict[str, str] | None = None) -> bytes:
    return wire.encode_request(version, program, "/", {"CNI_COMMAND": "VERSION", **(env or {})})


def send(sock: Path, data: bytes, fds: list[int], *, close_after: bool = True) -> socket.socket:
    """Connect and send ``data``, the descriptors with its first (up to) four bytes.

    With ``close_after``, the sending side is shut then, as a caller that
    stops short does.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    try:
        if data or fds:
            ancdata = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
            conn.sendmsg([data[: wire.HEADER_SIZE]], ancdata)
            if data[wire.HEADER_SIZE :]:
                conn.sendall(data[wire.HEADER_SIZE :])
        if close_after:
            conn.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the rest was read: the answer waits to be read
    return conn


def answer_of(conn: socket.socket) -> tuple[str, Any]:
    """("exited", status), ("refused", error object) or ("dropped", None); the connection is closed."""
    conn.settimeout(120)  # a daemon that never answers fails the test rather than hang it
    data = b""
    with conn:
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except ConnectionResetError:
            # A caller that sent more than its request: the end that held
            # the rest unread closed after the answer.
            assert data, "reset before any answer"
    if not data:
        return "dropped", None
    if data[0] == wire.EXITED and len(data) == 2:
        return "exited", data[1]
    assert data[0] == wire.REFUSED, data
    error = json.loads(data[1:])
    assert isinstance(error["code"], int) and isinstance(error["msg"], str), error
    return "refused", error


def call(sock: Path, data: bytes, fds: list[int], *, close_after: bool = True) -> tuple[str, Any]:
    return answer_of(send(sock, data, fds, close_after=close_after))


def refusal(sock: Path, data: bytes, fds: list[int]) -> dict[str, Any]:
    kind, error = call(sock, data, fds)
    assert kind == "refused", (kind, error)
    assert isinstance(error, dict)
    return error


def honest(d: Daemon, tmp_path: Path, container: str = "honest") -> None:
    """An ADD and a DEL through the shim, answered as without the daemon."""
    conf = ipam_conf(tmp_path)
    rc, out = shim(d.socket, "ADD", conf, name="sriov-ipam", env=ipam_env(container))
    assert rc == 0 and out["ips"][0]["address"].startswith("10.77.0."), out
    rc, out = shim(d.socket, "DEL", conf, name="sriov-ipam", env=ipam_env(container))
    assert rc == 0, out


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


# Repeating the same hostile load must not grow the daemon by more than
# what its allocator may keep of the load's peak.
RSS_SLACK_KIB = 8 << 10


def holds_no_more(d: Daemon, tmp_path: Path, load: Callable[[], None]) -> None:
    """Run ``load`` three times: the daemon's descriptors and children come back to where they were,
    and its memory stays where the first run left it."""
    honest(d, tmp_path)
    settled = _settle(d)
    load()
    honest(d, tmp_path)
    rss = _rss_kib(d.proc.pid)
    for _ in range(2):
        load()
        honest(d, tmp_path)
    _settle(d, settled)
    assert _rss_kib(d.proc.pid) - rss < RSS_SLACK_KIB, (rss, _rss_kib(d.proc.pid))


def _settle(d: Daemon, expected: tuple[int, int] | None = None) -> tuple[int, int]:
    """The daemon's descriptor count and number of children, once no call runs and served children ended.

    With ``expected``, once they are back to it (a refused caller's
    connection is closed once it is read to its end, a moment later).
    """

    def now() -> tuple[int, int]:
        return _descriptors(d.proc.pid), len(d.all_children())

    wait_for(lambda: not d.children() and len(d.all_children()) == childpool.SPARES)
    if expected is None:
        # Read from outside, the two counts are not taken at one instant (a
        # child that served a call ends, and a spare replaces it): the
        # baseline is a value that holds for a while.
        seen = [now()]
        while len(seen) < 6:
            time.sleep(0.1)
            current = now()
            seen = [*seen, current] if current == seen[-1] else [current]
        return seen[-1]
        try:
            wait_for(lambda: now() == expected)
        except AssertionError:
            held = sorted(os.readlink(f"/proc/{d.proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{d.proc.pid}/fd"))
            raise AssertionError(f"the daemon holds {now()} descriptors and children, not {expected}: {held}") from None
    return now()


@pytest.fixture
def hdaemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon whose children that served a call end soon, so its count of children settles."""
    d = Daemon(tmp_path / "run", "--child-idle", "0.2")
    yield d
    d.stop()


def test_a_frame_cut_at_any_byte_is_refused_as_truncated(
    hdaemon: Daemon, tmp_path: Path, stdin_file: int, devnull: int
) -> None:
    whole = frame()

    def load() -> None:
        for cut in range(len(whole)):
            fds = [stdin_file, devnull, devnull] if cut else []
            error = refusal(hdaemon.socket, whole[:cut], fds)
            assert error["code"] == 6 and "truncated request" in error["msg"], (cut, error)

    holds_no_more(hdaemon, tmp_path, load)
    # And whole, it runs.
    assert call(hdaemon.socket, whole, [stdin_file, devnull, devnull], close_after=False) == ("exited", 0)


@pytest.mark.parametrize(
    "length",
    [wire.MAX_REQUEST + 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF],
    ids=["one-over", "int32-max", "negative-as-int32", "uint32-max"],
)
def test_a_length_over_the_bound_is_refused_without_reading(
    hdaemon: Daemon, tmp_path: Path, stdin_file: int, devnull: int, length: int
) -> None:
    def load() -> None:
        conn = send(hdaemon.socket, length.to_bytes(4, "big"), [stdin_file, devnull, devnull], close_after=False)
        kind, error = answer_of(conn)
        assert kind == "refused" and error["code"] == 4 and str(length) in error["msg"], error

    holds_no_more(hdaemon, tmp_path, load)


def test_an_empty_request_is_refused_as_unreadable(hdaemon: Daemon, stdin_file: int, devnull: int) -> None:
    error = refusal(hdaemon.socket, (0).to_bytes(4, "big"), [stdin_file, devnull, devnull])
    assert error["code"] == 6 and "without version, program and working directory" in error["msg"], error


@pytest.mark.parametrize("version", ["0.0.1", "", "\udcff-not-utf-8"])
def test_another_version_is_refused_naming_both(hdaemon: Daemon, stdin_file: int, devnull: int, version: str) -> None:
    kind, error = call(hdaemon.socket, frame(version), [stdin_file, devnull, devnull], close_after=False)
    assert kind == "refused" and error["code"] == 11, error
    assert f"the sriov-cni daemon is {__version__}" in error["msg"] and "version skew" in error["msg"]


@pytest.mark.parametrize("count", [0, 1, 2, 4, 250])
def test_a_request_without_exactly_three_descriptors_is_refused(
    hdaemon: Daemon, tmp_path: Path, stdin_file: int, count: int
) -> None:
    def load() -> None:
        conn = send(hdaemon.socket, frame(), [stdin_file] * count, close_after=False)
        kind, error = answer_of(conn)
        assert kind == "refused" and error["code"] == 6, error
        assert "descriptors" in error["msg"], error

    # The descriptors the daemon was sent are closed again (holds_no_more).
    holds_no_more(hdaemon, tmp_path, load)


def _directory(tmp_path: Path) -> int:
    return os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)


def _listening(tmp_path: Path) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "listening.sock"))
    s.listen(1)
    return s.detach()


def _unconnected(tmp_path: Path) -> int:
    return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).detach()


def _unread_pipe(tmp_path: Path) -> int:
    r, w = os.pipe()
    os.close(r)
    return w


def _pipe_end(reading: bool) -> Callable[[Path], int]:
    def make(tmp_path: Path) -> int:
        r, w = os.pipe()
        os.close(w if reading else r)
        return r if reading else w

    return make


def _path_only(tmp_path: Path) -> int:
    (tmp_path / "file").write_text("{}")
    return os.open(tmp_path / "file", os.O_PATH)


def _eventfd(tmp_path: Path) -> int:
    return os.eventfd(0)


@pytest.mark.parametrize(
    "index,make,problem",
    [
        (0, _directory, "a directory"),
        (0, _listening, "a listening socket"),
        (1, _listening, "a listening socket"),
        (2, _unconnected, "a socket connected to nothing"),
        (1, _unread_pipe, "a pipe or socket nobody reads"),
        (0, _path_only, "opened only as a path"),
        (0, _pipe_end(reading=False), "not open for reading"),
        (1, _pipe_end(reading=True), "not open for writing"),
        (2, _eventfd, "neither a file, a pipe, a socket nor a character device"),
    ],
    ids=[
        "stdin-dir",
        "stdin-listening",
        "stdout-listening",
        "stderr-unconnected",
        "stdout-unread-pipe",
        "stdin-o-path",
        "stdin-write-end",
        "stdout-read-end",
        "stderr-eventfd",
    ],
)
def test_a_descriptor_that_cannot_serve_is_refused_naming_it(
    hdaemon: Daemon,
    tmp_path: Path,
    stdin_file: int,
    devnull: int,
    index: int,
    make: Callable[[Path], int],
    problem: str,
) -> None:
    odd = make(tmp_path)
    try:
        fds = [stdin_file, devnull, devnull]
        fds[index] = odd
        kind, error = call(hdaemon.socket, frame(), fds, close_after=False)
    finally:
        os.close(odd)
    name = ("stdin", "stdout", "stderr")[index]
    assert kind == "refused" and error["code"] == 6, error
    assert f"the caller's {name} is {problem}; nothing ran" in error["msg"], error


def test_a_stdin_that_ended_empty_is_read_as_empty(hdaemon: Daemon, devnull: int) -> None:
    r, w = os.pipe()
    os.close(w)
    try:
        kind, status = call(hdaemon.socket, frame(), [r, devnull, devnull], close_after=False)
    finally:
        os.close(r)
    assert (kind, status) == ("exited", 0)


def test_odd_environment_entries_do_not_refuse_the_call(hdaemon: Daemon, tmp_path: Path, stdin_file: int) -> None:
    body = b"\0".join(
        [__version__.encode(), b"sriov-ipam", b"/", b"=x", b"NO_EQUALS", b"", b"\xff\xfe=\x80", b"CNI_COMMAND=VERSION"]
    )
    r, w = os.pipe()
    try:
        kind, status = call(hdaemon.socket, len(body).to_bytes(4, "big") + body, [stdin_file, w, w], close_after=False)
        os.close(w)
        with os.fdopen(r, "rb") as out:
            printed = json.loads(out.read())
    finally:
        for fd in (r, w):
            try:
                os.close(fd)
            except OSError:
                pass
    assert (kind, status) == ("exited", 0)
    assert printed["cniVersion"] == "1.0.0", printed


def _still_waiting(conn: socket.socket) -> bool:
    """No answer yet, and not closed: the daemon is still waiting for this caller."""
    try:
        conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    return False


def test_idle_and_slow_callers_hold_no_child_and_delay_no_honest_call(
    tmp_path: Path, stdin_file: int, devnull: int
) -> None:
    # Long enough that none of the stalled callers is dropped before the
    # honest calls are done: they are served beside them, not after.
    d = Daemon(tmp_path / "run", "--request-timeout", "300", "--max-children", "4")
    stalled: list[socket.socket] = []
    try:
        baseline = _settle(d)
        for _ in range(200):
            stalled.append(send(d.socket, b"", [], close_after=False))
        whole = frame()
        for cut in (1, 4, 5, len(whole) - 1):  # a byte a second, at various points
            for _ in range(20):
                stalled.append(send(d.socket, whole[:cut], [stdin_file, devnull, devnull], close_after=False))
        for i in range(10):
            honest(d, tmp_path, f"beside-stalled-{i}")
        assert all(_still_waiting(conn) for conn in stalled)
        # No child holds a stalled caller: every one waits for a call.  One
        # that has just answered an honest call rejoins the waiting ones a
        # moment later (a loaded machine made that moment visible); one
        # holding a stalled caller would stay for the 300 s request timeout.
        wait_for(lambda: not d.children())
        for conn in stalled:
            conn.close()
        _settle(d, baseline)
    finally:
        for conn in stalled:
            conn.close()
        d.stop()


def test_a_stalled_caller_is_refused_after_the_request_timeout(tmp_path: Path, stdin_file: int, devnull: int) -> None:
    d = Daemon(tmp_path / "run", "--request-timeout", "0.5")
    try:
        whole = frame()
        kind, error = answer_of(send(d.socket, whole[:6], [stdin_file, devnull, devnull], close_after=False))
        assert kind == "refused" and error["code"] == 11, error
        assert "no complete request within 0.5 s" in error["msg"]
    finally:
        d.stop()


def test_a_thousand_callers_at_once_are_all_answered(
    hdaemon: Daemon, tmp_path: Path, stdin_file: int, devnull: int
) -> None:
    def load() -> None:
        conns = [send(hdaemon.socket, frame(), [stdin_file, devnull, devnull], close_after=False) for _ in range(1000)]
        answers = [answer_of(conn) for conn in conns]
        assert answers == [("exited", 0)] * 1000

    holds_no_more(hdaemon, tmp_path, load)


def test_more_stalled_callers_than_it_reads_at_once_make_way_for_honest_ones(hdaemon: Daemon, tmp_path: Path) -> None:
    baseline = _settle(hdaemon)
    over = server.MAX_PENDING + 100
    stalled = [send(hdaemon.socket, b"", [], close_after=False) for _ in range(over)]
    try:
        honest(hdaemon, tmp_path)
        # The oldest were told why they were dropped; the newest still wait.
        oldest = answer_of(stalled[0])
        assert oldest[0] == "refused" and "reading too many requests at once" in oldest[1]["msg"], oldest
        assert _still_waiting(stalled[-1])
    finally:
        for conn in stalled:
            conn.close()
    _settle(hdaemon, baseline)


def test_callers_that_leave_before_the_answer_leave_nothing_behind(
    hdaemon: Daemon, tmp_path: Path, stdin_file: int, devnull: int
) -> None:
    def load() -> None:
        for data in (frame(), frame(version="0.0.1"), wire.MAX_REQUEST.to_bytes(4, "big") + b"x" * 100):
            for _ in range(20):
                send(hdaemon.socket, data, [stdin_file, devnull, devnull], close_after=False).close()

    holds_no_more(hdaemon, tmp_path, load)


def test_a_call_whose_caller_left_while_it_waited_for_a_child_is_not_run(tmp_path: Path, devnull: int) -> None:
    d = Daemon(tmp_path / "run", "--max-children", "1", "--request-timeout", "60")
    conf = ipam_conf(tmp_path)
    first_stdin_r, first_stdin_w = os.pipe()
    try:
        # The only child is busy with a call whose stdin stays open.
        env = {**ipam_env("first"), "CNI_COMMAND": "ADD"}
        first = send(
            d.socket,
            wire.encode_request(__version__, "sriov-ipam", "/", env),
            [first_stdin_r, devnull, devnull],
            close_after=False,
        )
        wait_for(lambda: d.children())
        conf_file = tmp_path / "conf.json"
        conf_file.write_bytes(conf)
        second_stdin = os.open(conf_file, os.O_RDONLY)
        env = {**ipam_env("left-while-waiting"), "CNI_COMMAND": "ADD"}
        second = send(
            d.socket,
            wire.encode_request(__version__, "sriov-ipam", "/", env),
            [second_stdin, devnull, devnull],
            close_after=False,
        )
        os.close(second_stdin)
        second.close()
        os.write(first_stdin_w, conf)
        os.close(first_stdin_w)
        assert answer_of(first) == ("exited", 0)
        # Another call after it: the second, had it been kept, ran before it.
        honest(d, tmp_path, "after")
    finally:
        os.close(first_stdin_r)
        d.stop()
    owners = [p.read_text() for p in (tmp_path / "ipam").rglob("*") if p.is_file()]
    assert any("first" in owner for owner in owners), owners
    assert not any("left-while-waiting" in owner for owner in owners), owners


@dataclass(frozen=True)
class Frame:
    data: bytes
    # Where the caller stops sending (None: it sends all of data).
    cut: int | None
    # What it attaches as its stdin, stdout and stderr (any number).
    kinds: list[str]

    def sent(self) -> bytes:
        return self.data if self.cut is None else self.data[: self.cut]

    def complete(self) -> bool:
        """Whether a whole request, by its length, was sent (and can be answered without an end of stream)."""
        sent = self.sent()
        return len(sent) >= 4 and len(sent) >= 4 + min(int.from_bytes(sent[:4], "big"), wire.MAX_REQUEST + 1)

    def runnable(self) -> bool:
        """What the daemon must run, and only that: judged here without the wire module."""
        sent = self.sent()
        if len(sent) < 4 or self.kinds[:3] != self.kinds or len(self.kinds) != 3:
            return False
        if any(kind not in USABLE for kind in self.kinds):
            return False
        size = int.from_bytes(sent[:4], "big")
        if size > wire.MAX_REQUEST or len(sent) < 4 + size:
            return False
        fields = sent[4 : 4 + size].split(b"\0")
        return len(fields) >= 3 and fields[0] == __version__.encode() and fields[1] in (b"sriov", b"sriov-ipam")


USABLE = ("file", "devnull", "pipe")
KINDS = (*USABLE, "directory", "listening", "eventfd")
_field = st.text(st.characters(blacklist_characters="\0"), max_size=12)
# Raw entries: with or without "=", NUL bytes, any bytes, but never a CNI
# variable (the CNI_COMMAND=VERSION at the end keeps every run harmless).
_entry = st.binary(max_size=24).filter(lambda e: b"CNI_" not in e)


ASPECTS = ("version", "program", "cwd", "entries", "body", "length", "cut", "kinds")


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    """An honest call's frame with any of its aspects (often none) drawn at random instead."""
    broken = set(draw(st.lists(st.sampled_from(ASPECTS), max_size=3)))
    version = draw(_field) if "version" in broken else __version__
    program = draw(_field) if "program" in broken else draw(st.sampled_from(["sriov-ipam", "sriov"]))
    cwd = draw(st.sampled_from(["/", "/nonexistent", ""]) if "cwd" in broken else st.just("/"))
    entries = draw(st.lists(_entry, max_size=4)) if "entries" in broken else [b"PATH=/usr/bin:/bin"]
    body = b"\0".join(
        [
            version.encode("utf-8", "surrogateescape"),
            program.encode("utf-8", "surrogateescape"),
            cwd.encode(),
            *entries,
            b"CNI_COMMAND=VERSION",
        ]
    )
    if "body" in broken:
        body = draw(st.binary(max_size=64))
    length = (
        draw(st.one_of(st.integers(0, len(body) + 8), st.integers(0, 2**32 - 1))) if "length" in broken else len(body)
    )
    data = length.to_bytes(4, "big") + body
    cut = draw(st.integers(0, len(data))) if "cut" in broken else None
    kinds = (
        draw(st.lists(st.sampled_from(KINDS), max_size=5))
        if "kinds" in broken
        else draw(st.lists(st.sampled_from(USABLE), min_size=3, max_size=3))
    )
    return Frame(data, cut, kinds)


def _open_kind(kind: str, index: int, tmp_path: Path, opened: list[int]) -> int:
    """A descriptor of ``kind`` fit for ``index`` when it can be; every descriptor made goes to ``opened``."""
    if kind == "file":
        fd = (
            os.open(tmp_path / "stdin.json", os.O_RDONLY)
            if index == 0
            else os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        )
    elif kind == "devnull":
        fd = os.open(os.devnull, os.O_RDWR)
    elif kind == "pipe":
        r, w = os.pipe()
        if index == 0:
            os.write(w, VERSION_CONF)
            os.close(w)
            fd = r
        else:
            opened.append(r)  # kept open, so something could read it
            fd = w
    elif kind == "directory":
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    elif kind == "listening":
        fd = _listening_at(tmp_path / f"l{len(opened)}.sock")
    else:
        fd = os.eventfd(0)
    opened.append(fd)
    return fd


def _listening_at(path: Path) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s.detach()


def test_any_frame_is_answered_and_only_a_whole_valid_one_runs(hdaemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "stdin.json").write_bytes(VERSION_CONF)
    honest(hdaemon, tmp_path)
    baseline = _settle(hdaemon)

    @seed(30)
    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frames())
    def one(f: Frame) -> None:
        opened: list[int] = []
        try:
            fds = [_open_kind(kind, i, tmp_path, opened) for i, kind in enumerate(f.kinds)]
            kind, answer = answer_of(send(hdaemon.socket, f.sent(), fds, close_after=not f.complete()))
        finally:
            for fd in opened:
                os.close(fd)
            for sock in tmp_path.glob("l*.sock"):
                sock.unlink()
        if f.runnable():
            assert kind == "exited", (kind, answer)
        else:
            assert kind == "refused", (kind, answer)

    one()
    honest(hdaemon, tmp_path)
    _settle(hdaemon, baseline)


SOAK_SECONDS = float(os.environ.get("SRIOV_CNI_SOAK_SECONDS", "20"))


def _hostile_round(sock: Path, rng: random.Random, tmp_path: Path) -> None:
    """One hostile caller, of a kind drawn by ``rng``."""
    whole = frame()
    stdin = os.open(tmp_path / "stdin.json", os.O_RDONLY)
    out = os.open(os.devnull, os.O_WRONLY)
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fds = [stdin, out, out]
        choice = rng.randrange(7)
        if choice == 0:  # connects, says nothing, leaves
            conn = send(sock, b"", [], close_after=False)
            time.sleep(rng.uniform(0, 1))
            conn.close()
        elif choice == 1:  # stops short
            answer_of(send(sock, whole[: rng.randrange(len(whole))], fds))
        elif choice == 2:  # a length over the bound
            answer_of(
                send(sock, (wire.MAX_REQUEST + rng.randrange(1, 1 << 20)).to_bytes(4, "big"), fds, close_after=False)
            )
        elif choice == 3:  # a directory as stdin
            answer_of(send(sock, whole, [directory, out, out], close_after=False))
        elif choice == 4:  # leaves before its answer
            send(sock, whole, fds, close_after=False).close()
        elif choice == 5:  # a byte at a time, then gives up
            conn = send(sock, whole[:4], fds, close_after=False)
            for byte in whole[4 : 4 + rng.randrange(1, 8)]:
                conn.send(bytes([byte]))
                time.sleep(0.1)
            conn.close()
        else:  # a burst of fifty that connect and leave
            for conn in [send(sock, b"", [], close_after=False) for _ in range(50)]:
                conn.close()
    finally:
        for fd in (stdin, out, directory):
            os.close(fd)


def test_soak_honest_calls_are_all_served_beside_hostile_callers(tmp_path: Path) -> None:
    (tmp_path / "stdin.json").write_bytes(VERSION_CONF)
    d = Daemon(tmp_path / "run", "--request-timeout", "2", "--max-children", "8", "--child-idle", "0.2")
    served: list[int] = []
    hostile: list[int] = []
    failures: list[str] = []
    end = time.monotonic() + SOAK_SECONDS

    def honest_caller(n: int) -> None:
        i = 0
        while time.monotonic() < end:
            try:
                honest(d, tmp_path, f"soak-{n}-{i}")
                served.append(n)
            except AssertionError as exc:
                failures.append(f"honest caller {n}, call {i}: {exc}")
            i += 1

    def hostile_caller(n: int) -> None:
        rng = random.Random(n)
        while time.monotonic() < end:
            _hostile_round(d.socket, rng, tmp_path)
            hostile.append(n)

    try:
        honest(d, tmp_path)
        baseline = _settle(d)
        threads = [threading.Thread(target=honest_caller, args=(n,)) for n in range(3)]
        threads += [threading.Thread(target=hostile_caller, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures[:5]
        assert served and hostile
        print(
            f"soak: {len(served)} honest ADD/DEL pairs served, beside {len(hostile)} hostile callers, "
            f"in {SOAK_SECONDS:g} s"
        )
        _settle(d, baseline)
        honest(d, tmp_path)
    finally:
        d.stop()
