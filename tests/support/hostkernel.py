"""What this host's kernel offers, for the host tests whose case needs it absent."""

from __future__ import annotations

import socket

from sriov_cni.kernel.rdma import NETLINK_RDMA


def has_rdma_netlink() -> bool:
    """Whether the kernel answers NETLINK_RDMA: its RDMA core (ib_core) is loaded."""
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_RDMA).close()
    except OSError:
        return False
    return True
