"""VFs that do not come up in a pod are set aside, so that one broken VF does not fail every pod.

A self-allocating ADD takes the first free VF.  A VF that cannot carry a
pod's traffic (no carrier within ADD's bound while its PF has carrier, or
its ``link_state`` disabled at the PF by another tool), or whose RDMA
device another namespace holds (see :mod:`rdma`), would otherwise be
taken again by the next ADD, and by every ADD after it: kubelet retries the
sandbox, and lands on the same VF each time.  So ADD rolls the VF back as
always, records it as set aside in the VF store (why, when, how often) and,
within the same call, tries the next free VF.

A set-aside VF is passed over until its back-off ends (:func:`back_off`:
one minute, doubling with each failure, at most half an hour); after that
it is tried again, but only after every VF that was never set aside, so a
VF that is still broken costs a pod nothing while others are free.  The
first ADD it works for puts it back in the pool.  A VF named by a device
plugin or DRA driver (``deviceID``) is the caller's choice: it is tried
whatever its record says, and when it fails it is set aside for ``status``
to show, but nothing else is tried.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel import sysfs, vfsettings
from sriov_cni.vfstore import Allocation, SetAside, Store

logger = logging.getLogger(__name__)

BACK_OFF = 60.0
BACK_OFF_MAX = 1800.0
# How long one ADD goes on trying VFs after the first did not come up.  A
# broken VF costs the carrier wait (20 s) each, so three are tried when the
# first two fail; the next ADD passes over those.  kubelet gives a sandbox's
# creation, CNI ADDs included, 4 minutes (twice its 2-minute runtime
# request timeout), and Multus runs a pod's networks one after the other.
ADD_BUDGET = 60.0

NO_CARRIER = "no carrier"
LINK_DISABLED = "link disabled"
RDMA_ELSEWHERE = "RDMA device elsewhere"


class VfUnusable(CNIError):
    """The VF this ADD holds cannot carry the pod's traffic; another VF may."""

    def __init__(self, reason: str, msg: str, details: str = "") -> None:
        super().__init__(Code.DEVICE, msg, details)
        self.reason = reason


def back_off(failures: int) -> float:
    """Seconds a VF is passed over after its ``failures``-th failure in a row."""
    return min(BACK_OFF * 2.0 ** (failures - 1), BACK_OFF_MAX)


def refuse_disabled_link(alloc: Allocation, wanted: int | None) -> None:
    """Raise VfUnusable when the PF holds the VF's link disabled and the network does not ask for that.

    Another tool (or an operator taking the VF out of service) set it, and
    ADD must not undo it; a pod on it would have no traffic.  ``wanted``:
    the network's ``link_state``, None when it has none.
    """
    assert alloc.original is not None
    if wanted is None and alloc.original.pf.link_state == vfsettings.LINK_STATE_DISABLE:
        raise VfUnusable(
            LINK_DISABLED,
            f"VF {alloc.vf_pci} has link_state disable at PF {alloc.pf_netdev}, set outside this network",
            "it carries no traffic; `ip link set PF vf N state auto` brings it back",
        )


def ordered(vfs: list[sysfs.VF], aside: Mapping[str, SetAside], now: float) -> list[sysfs.VF]:
    """``vfs`` without those set aside until later; those whose back-off has ended go last."""
    clean = [vf for vf in vfs if vf.pci not in aside]
    due = [vf for vf in vfs if vf.pci in aside and aside[vf.pci].retry_after <= now]
    return clean + due


def set_aside(store: Store, alloc: Allocation, exc: VfUnusable, earlier: SetAside | None) -> SetAside:
    """Record ``alloc``'s VF as set aside after ``exc``, under the claim its caller holds; ``earlier``: its record."""
    now = time.time()
    failures = 1 if earlier is None else earlier.failures + 1
    record = SetAside(
        vf_pci=alloc.vf_pci,
        reason=exc.reason,
        detail=exc.msg,
        since=now if earlier is None else earlier.since,
        last=now,
        failures=failures,
        retry_after=now + back_off(failures),
    )
    store.set_aside(record)
    logger.warning(
        "set VF %s aside (%s, failure %d): %s; passed over for %.0f s",
        alloc.vf_pci,
        exc.reason,
        failures,
        exc.msg,
        record.retry_after - now,
    )
    return record


def came_back(store: Store, vf_pci: str, aside: Mapping[str, SetAside]) -> None:
    """``vf_pci`` worked for a pod: it is no longer set aside (under its claim)."""
    if vf_pci in aside:
        store.unset_aside(vf_pci)
        logger.info("VF %s, set aside since %s, came up: back in the pool", vf_pci, time.ctime(aside[vf_pci].since))
