"""What a failed netlink or namespace operation means, as exceptions callers can act on.

Kernel errno answers become a handful of domain exceptions, so callers
decide on *what happened* (link gone, name taken, driver cannot do it,
busy for now) rather than on errno numbers.  Importing this module costs
nothing: code that only needs to catch these does not load pyroute2.
"""

from __future__ import annotations

import errno
import os


class NetlinkError(Exception):
    """A netlink request failed; ``errno`` is the kernel's answer."""

    def __init__(self, msg: str, code: int = 0) -> None:
        super().__init__(msg)
        self.errno = code


class LinkNotFound(NetlinkError):
    pass


class LinkExists(NetlinkError):
    pass


class NotSupported(NetlinkError):
    pass


class InvalidArgument(NetlinkError):
    pass


class Busy(NetlinkError):
    pass


class NetnsNotFound(NetlinkError):
    pass


class AddressRefused(NetlinkError):
    """The device refused a MAC address (igbvf: the PF holds an admin MAC for the VF)."""


BY_ERRNO: dict[int, type[NetlinkError]] = {
    errno.ENODEV: LinkNotFound,
    errno.ENOENT: LinkNotFound,
    errno.EEXIST: LinkExists,
    errno.ENOTEMPTY: LinkExists,
    errno.EOPNOTSUPP: NotSupported,
    errno.EINVAL: InvalidArgument,
    errno.ERANGE: InvalidArgument,
    errno.EBUSY: Busy,
    errno.EAGAIN: Busy,
    errno.EADDRNOTAVAIL: AddressRefused,
}


def for_errno(what: str, code: int, ack: str = "") -> NetlinkError:
    """The exception for the kernel's answer ``code`` to the request described by ``what``, with its extended-ack text ``ack``."""
    return BY_ERRNO.get(code, NetlinkError)(f"{what}: {os.strerror(code)}" + (f" ({ack})" if ack else ""), code)
