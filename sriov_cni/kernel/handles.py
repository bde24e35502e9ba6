"""Netlink handles, one per namespace, opened on demand and cached for a CNI call.

Opening a handle inside another namespace costs more than most requests, so
within a :func:`session` each namespace's handle is reused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sriov_cni.kernel.links import Namespace
from sriov_cni.kernel.netns import netlink_socket_in
from sriov_cni.kernel.nlerrors import NetlinkError
from sriov_cni.kernel.rtnl import Rtnl


def _open(path: str | None) -> Namespace:
    return Namespace(Rtnl(netlink_socket_in(path) if path else None), path)


# Handles kept open for the duration of a session (one CNI command):
# opening a handle inside another namespace costs more than most requests.
_session: dict[str | None, Namespace] | None = None
# Handles taken out of the session after a failure, closed at its end.
_retired: list[Namespace] = []


@contextmanager
def session() -> Iterator[None]:
    """Reuse one handle per namespace until the block ends."""
    global _session
    if _session is not None:
        yield
        return
    _session = {}
    try:
        yield
    finally:
        handles, _session = _session, None
        for ns in [*handles.values(), *_retired]:
            ns.close()
        _retired.clear()


@contextmanager
def open_namespace(path: str | None = None) -> Iterator[Namespace]:
    """A netlink handle bound to the namespace at ``path`` (``None``: our own).

    Never creates a namespace: a path that vanished fails to open, which is
    exactly the case DEL must recognise (a new empty namespace would hide it).
    """
    if _session is None:
        ns = _open(path)
        try:
            yield ns
        finally:
            ns.close()
        return
    ns = _session.get(path) or _open(path)
    _session[path] = ns
    try:
        yield ns
    except NetlinkError:
        # A failed request may leave the handle unusable (the namespace
        # may be gone); the next use opens a fresh one.  Only this handle
        # leaves the cache (a nested use may already have replaced it, and
        # dropping that one leaked its socket), and it is closed when the
        # session ends, since an enclosing block may still hold it.
        if _session is not None and _session.get(path) is ns:
            del _session[path]
        _retired.append(ns)
        raise
