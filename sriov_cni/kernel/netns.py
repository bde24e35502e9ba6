"""Network namespaces as a process deals with them: identity, entering, running code inside.

No netlink here, and no pyroute2: what allocation and the tuning hook need
(a namespace's identity, running a function in a pod's namespace with its
own sysfs) comes without loading it, and the netlink modules get their
sockets created inside a namespace from here.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from sriov_cni.kernel.libc import libc
from sriov_cni.kernel.nlerrors import NetnsNotFound


class NamespaceError(Exception):
    """Code run inside a network namespace failed: entering it, mounting its sysfs, or the code itself.

    Not a netlink failure, though ``errno`` is the one the failing call got.
    """

    def __init__(self, msg: str, code: int = 0) -> None:
        super().__init__(msg)
        self.errno = code


def open_netns(netns_path: str) -> int:
    try:
        # O_NONBLOCK: a FIFO in place of a namespace must not hang the call.
        return os.open(netns_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NetnsNotFound(f"network namespace {netns_path} does not exist", errno.ENOENT) from exc
    except OSError as exc:
        raise NetnsNotFound(f"cannot open network namespace {netns_path}: {exc.strerror}", exc.errno or 0) from exc


def own_netns_path() -> str:
    """The namespace this process runs in (the "host" side of every move)."""
    return f"/proc/{os.getpid()}/ns/net"


_CLONE_NEWNET = 0x40000000
_NETLINK_ROUTE = 0


def _setns(fd: int) -> None:
    if libc().setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _enter(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd)
    finally:
        os.close(fd)


_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_SLAVE = 0x80000


def _private_sysfs(at: Path) -> None:
    # sysfs shows the netdevs of the namespace that mounted it, so a fresh
    # mount in a private mount namespace shows the pod's interfaces
    # (what `ip netns exec` does).
    if libc().unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc().mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        raise OSError(ctypes.get_errno(), "making / a slave mount")
    target = os.fsencode(at)
    libc().umount2(target, 2)  # MNT_DETACH; nothing mounted there is fine
    if libc().mount(b"sysfs", target, b"sysfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mounting sysfs")


def run_in_netns(path: str | None, func: Callable[[], None], *, own_sysfs: Path | None = None) -> None:
    """Run ``func`` with the calling context inside the network namespace ``path``.

    /proc/sys/net and sysfs' class/net reflect the namespace of the process
    that looks (sysfs: of the one that mounted it; ``own_sysfs`` mounts a
    fresh one at that path), so ``func`` runs in a short-lived forked child
    that enters the namespace; this process never leaves its own.  ``path``
    None runs ``func`` here.  An OSError in the child (entering the
    namespace, mounting sysfs, or in ``func``) is reported as
    NamespaceError carrying its errno.
    """
    if path is None:
        func()
        return
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = errno.EIO
        try:
            os.close(read_end)
            message = b""
            try:
                _enter(path)
                if own_sysfs is not None:
                    _private_sysfs(own_sysfs)
                func()
                code = 0
            except OSError as exc:
                code = exc.errno or errno.EIO
                message = str(exc).encode()
            except BaseException as exc:
                message = repr(exc).encode()
            # Raises BrokenPipeError when the caller was killed meanwhile.
            os.write(write_end, message[:4000])
        finally:
            # Whatever happens, the child ends here: one that unwound into
            # its parent's frames would carry on with the CNI command (its
            # rollback, its answer) beside the parent, or after its death.
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        reason = r.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise NamespaceError(f"in network namespace {path}: {reason or os.strerror(code)}", code)


def netlink_socket_in(path: str, protocol: int = _NETLINK_ROUTE) -> socket.socket:
    """A netlink socket of ``protocol`` (rtnetlink unless told) created inside the namespace at ``path``.

    A socket stays in the namespace it was created in, so this thread steps
    in, creates it and steps straight back: a few system calls, where
    pyroute2's own way forks a helper process for every handle.
    """
    target = open_netns(path)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            _setns(target)
        except OSError as exc:
            raise NetnsNotFound(f"cannot enter network namespace {path}: {exc.strerror}", exc.errno or 0) from exc
        try:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, protocol)
        finally:
            # Staying in the pod's namespace would misdirect every later
            # host-side operation of this process; there is no safe way on.
            try:
                _setns(home)
            except OSError:
                os._exit(70)
    finally:
        os.close(target)
        os.close(home)


def netns_inode(path: str) -> int | None:
    """Identity of a network namespace file, or None when it is gone (or is no namespace file)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    # A namespace file (nsfs) stats as a regular file; a FIFO or a device
    # there is not one, and opening it could block.
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_ino


def is_own_netns(path: str) -> bool:
    """Whether ``path`` is the network namespace this process runs in (the host's)."""
    try:
        there, here = os.stat(path), os.stat(own_netns_path())
    except (OSError, ValueError):
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def held_elsewhere(inode: int, proc: Path) -> bool:
    """Whether the network namespace ``inode`` still lives under another name: a bind mount, or a process in it.

    A runtime's netns path is only one handle on a namespace: removing it
    ends the namespace only if nothing else holds it, and a pod's VF stays
    in a namespace that lives on.  Mounts are those this process's mount
    namespace sees; processes, those its PID namespace does (``proc``: the
    node's procfs).
    """
    tag = f"net:[{inode}]"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            # The fourth field is the mounted file's root: an nsfs bind mount shows the namespace there.
            if any(line.split(" ", 4)[3:4] == [tag] for line in mounts):
                return True
    except OSError:
        pass
    for pid in os.listdir(proc):
        if pid.isdigit():
            try:
                if os.readlink(proc / pid / "ns" / "net") == tag:
                    return True
            except OSError:
                continue  # ended meanwhile, or not ours to read
    return False


@functools.cache
def boot_id() -> str:
    """This boot's identity (the kernel's random boot_id): a namespace recorded under another is gone."""
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()
