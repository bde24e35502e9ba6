"""Paths from configuration, opened the way a process running as root must.

The plugins run as root and take ``dataDir``, ``logFile``, ``ipam.dataDir``
and ``ipam.resolvConf`` from a network configuration.  A path that goes
through a symlink, a directory others may write to, or a FIFO or device in
place of a file could redirect a root write or hang the call, so:

* directories we write in are walked from ``/`` one component at a time
  with ``O_NOFOLLOW`` (a symlinked component is refused, not followed),
  missing ones are created (0700 unless host-local's layout says
  otherwise), and the last one must belong to us and be
  writable by nobody else;
* files are opened ``O_NOFOLLOW | O_NONBLOCK`` (opening a FIFO would block)
  and must be regular files;
* reads are bounded;
* a file readers trust whole is replaced, never rewritten in place
  (:func:`replace_file`).

Every refusal is a CNIError naming the path.
"""

from __future__ import annotations

import errno
import os
import stat

from sriov_cni.cni import CNIError, Code, io_error, shown

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def absolute(value: str, key: str) -> str:
    """``value`` as a path from configuration ``key``: absolute, no NUL byte."""
    if "\0" in value or not value.isprintable():
        raise CNIError(Code.INVALID_CONFIG, f"{key} {shown(value)} is not a usable path")
    if not os.path.isabs(value):
        # A relative path would resolve against whatever directory the
        # runtime happened to start the plugin in.
        raise CNIError(Code.INVALID_CONFIG, f"{key} {shown(value)} must be an absolute path")
    return os.path.normpath(value)


def _walk(path: str, create_mode: int | None) -> int:
    """A descriptor of directory ``path``, reached without following any symlink."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in path.split("/"):
            if not part:
                continue
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                try:
                    os.mkdir(part, create_mode, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def state_dir(path: str, mode: int = 0o700, what: str = "state directory") -> None:
    """Make sure ``path`` is a directory only we can write, creating it ``mode``.

    No component may be a symlink; the directory must be owned by this
    user and not group- or world-writable (anyone who can write there could
    plant records or swap files under us).  An existing one is used as it
    is: its mode is never changed here.
    """
    fd = _checked_dir(path, mode, what)
    os.close(fd)


def private_dir(path: str, ours: str, what: str) -> None:
    """:func:`state_dir` with mode 0700, narrowed to 0700 if it holds only ``ours``.

    An existing directory is made private only when it holds nothing but
    the entry named ``ours`` (what we put there on an earlier run):
    narrowing one that holds others' files (``/run``) would cut every
    other user off them.
    """
    fd = _checked_dir(path, 0o700, what)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != 0o700 and set(os.listdir(fd)) <= {ours}:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _checked_dir(path: str, mode: int, what: str) -> int:
    try:
        fd = _walk(path, mode)
    except OSError as exc:
        raise io_error(exc, f"cannot use {what} {path}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise CNIError(
            Code.IO_FAILURE,
            f"{what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid})",
            f"make it owned by root and not group- or world-writable (chmod {mode:04o}), or choose another",
        )
    return fd


def open_log(path: str) -> int:
    """A write descriptor for log file ``path``, created 0600, appending.

    Its directory is not created (a typo should not make directories as
    root), and neither it nor the file may be a symlink.
    """
    parent, name = os.path.split(path)
    try:
        dfd = _walk(parent, None)
        try:
            fd = os.open(
                name,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
                dir_fd=dfd,
            )
        finally:
            os.close(dfd)
    except OSError as exc:
        raise io_error(exc, f"cannot open log file {path}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CNIError(Code.IO_FAILURE, f"log file {path} is not a regular file")
    return fd


def read_file(path: str, limit: int) -> bytes:
    """The content of regular file ``path``, refused when larger than ``limit`` bytes.

    Symlinks are followed here (resolv.conf usually is one, and reading
    writes nothing); FIFOs and devices are refused without blocking.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
    return data


def replace_file(path: str | os.PathLike[str], data: bytes, mode: int, sync: bool = True) -> None:
    """Make ``data`` the content of file ``path`` at once: a reader opens the old file or the new, never part of one.

    Written to ``.<name>.<pid>.tmp`` beside it, opened without following a
    symlink (one planted there is refused, not written through), given
    ``mode``, synced unless ``sync`` is False, and renamed over ``path``.
    The temporary file does not outlive a failure.  Raises OSError.
    """
    parent, name = os.path.split(os.fspath(path))
    tmp = os.path.join(parent, f".{name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            # Not through os.open's mode, which the umask narrows and which
            # a temporary file left by a killed writer would keep.
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # never created
        raise
