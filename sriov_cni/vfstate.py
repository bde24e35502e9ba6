"""What a VF is to us now: free, allocated, stale or in use by someone else.

Judged from the VF store's record and the kernel's view of the VF, by the
plugin choosing a VF (:mod:`sriov_cni.plugin.allocate`, its STATUS) and by
``sriov-cni status``.  A VF is *free* when the store holds no allocation for
it and it is usable: its netdev sits in the host network namespace, or it is
bound to a DPDK driver.  An allocation whose network namespace is gone is
*stale*: the container died without a DEL, or before the node's last boot.
The daemon gives such a VF back (*giving back* while it does); without a
daemon, an ADD that finds no free VF does.  Any other VF is *in use*.  A
free VF that did not come up in a pod is *set aside* for a while.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path

from sriov_cni.kernel import netns, sysfs
from sriov_cni.paths import Paths
from sriov_cni.vfstore import Allocation

# Why a recorded namespace is gone (gone(), and the daemon's metrics).
NETNS_GONE = "netns gone"
EARLIER_BOOT = "earlier boot"


class VfState(enum.Enum):
    FREE = "free"
    ALLOCATED = "allocated"
    STALE = "stale"
    # Not ours and not usable: its netdev is in some other namespace, or it
    # has no driver.
    IN_USE = "in use"
    # Free, but it did not come up in a pod (see sriov_cni.plugin.aside).
    SET_ASIDE = "set aside"
    # Stale, and the daemon is giving it back (see sriov_cni.daemon.heal).
    GIVING_BACK = "giving back"
    # Its record cannot be read (damaged, or not the store's): no ADD takes
    # it, since a guess could give it to two pods; status says why.
    UNREADABLE = "unreadable record"


def gone(alloc: Allocation, proc: Path) -> str | None:
    """Why the allocation's network namespace is gone ("earlier boot", "netns gone"), or None while it lives.

    A namespace whose path was removed may live on, held by a bind mount or
    a process elsewhere (``proc``: the node's procfs); it is gone only when
    nothing holds it.
    """
    if alloc.boot_id and alloc.boot_id != netns.boot_id():
        return EARLIER_BOOT
    inode = netns.netns_inode(alloc.netns)
    if inode is not None and (alloc.netns_inode is None or inode == alloc.netns_inode):
        return None
    if alloc.netns_inode is not None and netns.held_elsewhere(alloc.netns_inode, proc):
        return None
    return NETNS_GONE


def netns_alive(alloc: Allocation, proc: Path) -> bool:
    """Whether the allocation's network namespace still exists (and is the same one)."""
    return gone(alloc, proc) is None


def recorded_state(alloc: Allocation, proc: Path) -> VfState:
    """A VF the store holds a record of: allocated while that record's namespace lives, else stale or being given back."""
    if netns_alive(alloc, proc):
        return VfState.ALLOCATED
    return VfState.GIVING_BACK if alloc.giving_back else VfState.STALE


def unrecorded_state(driver: str | None, netdev: str | None, in_host: Callable[[str], bool]) -> VfState:
    """A VF the store holds no record of, from its driver and the host netdev sysfs lists for it.

    ``in_host`` says whether a netdev name exists in the host namespace.
    """
    if driver in sysfs.DPDK_DRIVERS:
        return VfState.FREE
    # sysfs lists a VF's netdev only while it is in the host namespace; the
    # netlink look-up confirms it (and keeps a test tree of sysfs honest).
    if netdev is not None and in_host(netdev):
        return VfState.FREE
    return VfState.IN_USE


def vf_state(paths: Paths, vf_pci: str, alloc: Allocation | None, in_host: Callable[[str], bool]) -> VfState:
    """Classify one VF, reading sysfs only when it has no record."""
    if alloc is not None:
        return recorded_state(alloc, paths.proc)
    return unrecorded_state(*sysfs.driver_and_netdev(paths.sys, vf_pci), in_host)
