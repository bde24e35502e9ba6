"""ADD returns once the pod's VF has carrier; CHECK reports a VF without carrier while its PF has it.

A VF netdev reports carrier only once its driver has heard from the PF
that the link is up.  igbvf asks from a watchdog that runs every 2 s after
the netdev is opened, so a pod's first packets, sent as soon as ADD has
returned, went nowhere: an application's first connection attempts and
the first pings failed while the pod already had its interface and
address.  The reference sriov-cni and host-device return without waiting.

The wait is bounded, and happens only while the PF has carrier: a VF's
carrier follows its PF's link, so while the PF has none (or is down, or
sysfs does not tell) there is nothing to wait for, and the pod gets its VF
as it is; the VF's carrier comes with the PF's.  A VF whose ``link_state``
is ``disable`` never has carrier.  A VF that stays without carrier for the
whole bound while its PF has carrier cannot carry the pod's traffic: ADD
rolls it back, sets it aside and tries another (see :mod:`aside`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sriov_cni.kernel import firstopen, netlink, sysfs, vfsettings
from sriov_cni.plugin import aside
from sriov_cni.vfstore import Allocation

logger = logging.getLogger(__name__)

# Longer than a VF driver takes to report carrier on any node, however
# loaded (igbvf: one watchdog period of 2 s; under emulation, seconds more).
CARRIER_WAIT = 20.0
_POLL = 0.05


def _expected(sys_root: Path, alloc: Allocation) -> bool:
    """Whether the VF should have carrier: its PF has, and nobody disabled the VF's link."""
    if alloc.applied.link_state == vfsettings.LINK_STATE_DISABLE:
        return False
    return sysfs.carrier(sys_root, alloc.pf_netdev) is True


def train(sys_root: Path, alloc: Allocation) -> None:
    """Open and close in the host, once, a VF netdev that never had carrier, before it goes to the pod.

    Such a VF (created by another tool, or while its PF was down) may be
    past its driver's first reset only seconds after its first open (see
    sriov_cni.kernel.firstopen); a VF that had carrier once is past it.  The
    kernel's ``carrier_up_count`` tells them apart, whatever driver and
    whoever created the VF.  Called before ADD changes the VF: the PF's
    reading of its MAC is still the one recorded.
    """
    orig = alloc.original
    assert orig is not None
    if sysfs.carrier_ups(sys_root, orig.netdev) != 0:
        return
    try:
        firstopen.open_once(alloc.pf_netdev, alloc.vf_index, orig.netdev, orig.pf.mac)
    except firstopen.FirstOpenError as exc:
        # The pod still gets the VF: its carrier comes later, and ADD waits for it.
        logger.warning("could not open new VF %s once before the pod: %s", alloc.vf_pci, exc)


def await_carrier(sys_root: Path, alloc: Allocation, index: int, bound: float) -> None:
    """Return once link ``index`` (the VF in the pod) has carrier, or its PF has none; raise after ``bound`` s."""
    started = time.monotonic()
    with netlink.open_namespace(alloc.netns) as pod:
        while not pod.get(index).carrier:
            if not _expected(sys_root, alloc):
                return
            waited = time.monotonic() - started
            if waited >= bound:
                raise aside.VfUnusable(
                    aside.NO_CARRIER,
                    f"VF {alloc.vf_pci} has no carrier {bound:g} s after it was brought up in the pod, "
                    f"while its PF {alloc.pf_netdev} has carrier",
                    "the VF driver has not heard from the PF; see the kernel log for the VF's PCI address",
                )
            time.sleep(_POLL)
    waited = time.monotonic() - started
    if waited > 1.0:
        logger.info("VF %s had carrier %.1f s after it was brought up", alloc.vf_pci, waited)


def problems(sys_root: Path, alloc: Allocation, pod_link: netlink.LinkInfo) -> list[str]:
    """CHECK's finding when the VF in the pod has no carrier although it should have."""
    if pod_link.carrier or not pod_link.up or not _expected(sys_root, alloc):
        return []
    return [f"link has no carrier while PF {alloc.pf_netdev} has carrier: the VF carries no traffic"]
