"""Putting a VF into a pod and giving it back exactly as it was found.

ADD records the VF's original state and the settings it is about to make
before changing anything, applies the PF-side settings, then moves the
netdev into the pod and renames it there in the same request.  Everything
ADD did can be undone from that record alone, so DEL, a failed ADD, GC and
the reclaiming of a stale allocation all go through :func:`restore`, in the
one order drivers accept: PF side first (the admin MAC only lifted), then
the netdev, then the admin MAC as recorded.

The VF's MAC at the PF, and why a give-back leaves it as the VF was created
---------------------------------------------------------------------------
On igb the PF's reading of a VF's MAC (IFLA_VF_MAC) *is* the VF's entry in
the PF's receive filter: an admin MAC write replaces it, a zero write
empties it, and igbvf fills it with its netdev's MAC only when it asks the
PF for a MAC change or when it resets (a close does that; so, in the guest
tests, does the first open of a new VF, whose carrier takes seconds
longer).  igb neither resets the VF on an admin MAC write nor tells it.  So "the reading equals the one before the first ADD" (zero,
for a VF nobody opened) and "the VF receives its own MAC's traffic" cannot
both hold after DEL: a VF given back is, like a newly created one, not in
the filter.  DEL therefore restores the reading (zero included), and ADD
makes the VF program its MAC into the filter before the pod gets it: with a
``mac``, the admin MAC write does it; without one, the netdev is given the
MAC it already has, which igbvf sends to the PF (:func:`_program_own_mac`).
Without that, every pod after a VF's first was attached with no traffic.

Drivers differ in what an admin MAC write does to a running VF, and this is
the only place that depends on it:

- igb and ixgbe change the filter and the reading only (zero: the admin
  lock is lifted and the filter entry emptied); the VF learns an admin MAC
  when it resets, and programs its own MAC again only on a MAC change or a
  reset.  Hence :func:`_program_own_mac` at ADD, and the reset in
  :func:`_set_effective_mac` when igbvf refuses a MAC while an admin MAC
  is held.
- i40e and ice reset the VF on every admin MAC write, zero included; iavf
  then asks for its MAC again by itself, so the filter holds the netdev's
  MAC afterwards and giving the netdev its own MAC again changes nothing.
- mlx5 keeps the admin MAC in the vport's context (and the node GUID, and
  the spoof-check ACL) without resetting the VF; in legacy mode its filter
  comes from the MAC list the VF driver sets, and the reading is the admin
  MAC only, zero when none is set.
- bnxt refuses a zero admin MAC, so the recorded reading is written back
  instead (:func:`_lift_admin_mac`, :func:`restore_admin_mac`).

Which PF drivers report the VF's own MAC in the reading, which CHECK relies
on, is :data:`sriov_cni.kernel.vfsettings.OWN_MAC_IN_READING`.

What a pod leaves on its VF
---------------------------
A netns move (``__dev_change_net_namespace`` in net/core/dev.c) closes the
netdev, shuts its qdiscs down (``dev_shutdown``: a clsact goes, its filters
with it), tells the protocols it is unregistering (IPv4/IPv6 addresses,
routes, neighbours and per-device sysctls go) and flushes its unicast and
multicast address lists.  Unlike unregistering, it keeps XDP programs and
tcx links (no ``dev_xdp_uninstall``/``dev_tcx_uninstall``), and it keeps
everything held in the net_device or by the driver: name and altnames, MAC,
MTU, flags and their counts, txqueuelen, group, alias, GSO/GRO limits, and
the driver's offloads, rings, channels, coalescing, pause, private flags and
FEC (a close resets the VF's hardware, not the driver's settings).  So ADD
records all of those (:func:`snapshot`) and DEL compares the VF with the
record from one reading and writes back only what differs
(:func:`_restore_link`).  An XDP program recorded before ADD cannot be
attached again (its fd is not ours), so only one the pod attached is
detached; promiscuity and allmulti counts are not written, since only the
packet socket that holds one can drop it, and it does when the pod's
processes exit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel import ethtool, netlink, sysfs
from sriov_cni.kernel.netlink import LinkInfo, Namespace, VfControl
from sriov_cni.kernel.vfsettings import ZERO_MAC
from sriov_cni.vfstore import Allocation, OriginalState

logger = logging.getLogger(__name__)

# Some drivers (i40e/iavf) apply VF MACs asynchronously and answer EBUSY
# meanwhile, so MAC changes are read back and retried for up to 2 s; the
# functions that set MACs take the delay between attempts (``retry``), and
# this is its default.
MAC_ATTEMPTS = 20
MAC_RETRY_DELAY = 0.1
# How long a give-back waits for a VF netdev to come home from a pod
# namespace that is gone: its file goes at once, but the kernel hands the
# namespace's physical netdevs back to the host only when its cleanup work
# runs, later (seconds on a busy node).
HOME_WAIT = 10.0
HOME_POLL = 0.05
# The name a VF comes home under when another device took its own meanwhile.
HOME_NAME_TEMPLATE = "sriovvf%d"


def snapshot(vfc: VfControl, host: Namespace, alloc: Allocation, vf: sysfs.VfDevice) -> OriginalState:
    """The state of ``alloc``'s VF before the allocation touches it; its netdev is the one ``vf`` names."""
    info = vfc.vfs(alloc.pf_netdev).get(alloc.vf_index)
    if info is None:
        raise CNIError(Code.DEVICE, f"PF {alloc.pf_netdev} reports no VF {alloc.vf_index}")
    state = OriginalState(pf=info)
    if not alloc.dpdk:
        link = host.find(vf.netdev) if vf.netdev else None
        if link is None:
            raise CNIError(Code.DEVICE, f"VF {vf.pci} has no netdev in the host network namespace")
        state.netdev = link.name
        state.mtu = link.mtu
        state.mac = link.mac
        state.promisc = link.promisc
        state.flags = {name: link.flag(name) for name in ("allmulti", "multicast", "noarp")}
        state.settings = dict(link.settings)
        state.altnames = list(link.altnames)
        state.alias = link.alias
        state.xdp = link.xdp[0][1] if link.xdp else 0
        state.ethtool = ethtool.read(link.name)
    return state


def _set_admin_mac(vfc: VfControl, pf: str, vf: int, mac: str, retry: float) -> None:
    for _ in range(MAC_ATTEMPTS):
        try:
            vfc.set_mac(pf, vf, mac)
        except netlink.Busy:
            time.sleep(retry)
            continue
        info = vfc.vfs(pf).get(vf)
        if info is not None and info.mac == mac:
            return
        time.sleep(retry)
    raise CNIError(Code.DEVICE, f"PF {pf} did not take admin MAC {mac} for VF {vf}")


def _pf_setters(vfc: VfControl, alloc: Allocation, retry: float) -> dict[str, Callable[[Any], None]]:
    pf, vf = alloc.pf_netdev, alloc.vf_index
    return {
        "vlan": lambda v: vfc.set_vlan(pf, vf, v.id, v.qos, v.proto),
        "mac": lambda v: _set_admin_mac(vfc, pf, vf, v, retry),
        "rate": lambda v: vfc.set_rate(pf, vf, v.min_tx, v.max_tx),
        "spoofchk": lambda v: vfc.set_spoofchk(pf, vf, v),
        "trust": lambda v: vfc.set_trust(pf, vf, v),
        "link_state": lambda v: vfc.set_link_state(pf, vf, v),
    }


# Each PF-side setting by the keys a network configuration gives it with:
# a refusal names what the user wrote.
_CONFIG_KEYS = {
    "vlan": "vlan",
    "mac": "mac",
    "rate": "min_tx_rate/max_tx_rate",
    "spoofchk": "spoofchk",
    "trust": "trust",
    "link_state": "link_state",
}


def apply_pf_settings(vfc: VfControl, alloc: Allocation, retry: float) -> None:
    """Apply ``alloc.applied`` (recorded before this call) in order.

    On failure the settings that were never applied are dropped from
    ``alloc.applied``, so restoring does not try to undo them (which would
    fail again on a driver that cannot do them at all).
    """
    setters = _pf_setters(vfc, alloc, retry)
    wanted = alloc.applied.items()
    for n, (key, value) in enumerate(wanted):
        try:
            setters[key](value)
        except (netlink.NetlinkError, CNIError) as exc:
            alloc.applied = alloc.applied.without(name for name, _ in wanted[n:])
            what = _CONFIG_KEYS[key]
            if isinstance(exc, netlink.NotSupported):
                raise CNIError(
                    Code.DEVICE,
                    f"the driver of PF {alloc.pf_netdev} does not support setting {what} on a VF",
                    f"{exc}; remove {what} from the network configuration",
                ) from exc
            if isinstance(exc, CNIError):
                raise
            raise CNIError(Code.DEVICE, f"cannot set {what} on VF {alloc.vf_pci}", str(exc)) from exc


def restore_pf_settings(vfc: VfControl, alloc: Allocation, retry: float) -> list[str]:
    """Put back every PF-side setting the allocation changed; returns failures.

    The admin MAC is only lifted here (see :func:`_lift_admin_mac`); the
    recorded one goes back after the netdev, in :func:`restore_admin_mac`.
    """
    if alloc.original is None:
        return []
    setters = _pf_setters(vfc, alloc, retry)
    failures = []
    # Reverse order of application: trust goes back after the MAC, because
    # some drivers refuse MAC changes on an untrusted VF.
    for key, _ in reversed(alloc.applied.items()):
        original = getattr(alloc.original.pf, key)
        if original is None:
            continue
        try:
            if key == "mac":
                _lift_admin_mac(vfc, alloc, original, retry)
            else:
                setters[key](original)
        except (netlink.NetlinkError, CNIError) as exc:
            failures.append(f"{key}: {exc}")
    return failures


def _lift_admin_mac(vfc: VfControl, alloc: Allocation, original: str, retry: float) -> None:
    """Clear the admin MAC ADD set, so the VF netdev may take its own MAC back.

    igb refuses a VF's own MAC change while the PF holds an admin MAC for it
    ("attempted to override administratively set MAC address"), and writing
    the recorded reading straight back would lock the VF to it: igb reports a
    MAC the VF chose itself in the same attribute as an admin MAC, so the
    reading cannot tell the two apart.  A zero admin MAC removes the lock.
    Drivers that refuse a zero MAC (bnxt) get the recorded one directly.
    """
    if alloc.dpdk:
        _set_admin_mac(vfc, alloc.pf_netdev, alloc.vf_index, original, retry)
        return
    try:
        _set_admin_mac(vfc, alloc.pf_netdev, alloc.vf_index, ZERO_MAC, retry)
    except (netlink.InvalidArgument, CNIError):
        _set_admin_mac(vfc, alloc.pf_netdev, alloc.vf_index, original, retry)


def restore_admin_mac(vfc: VfControl, alloc: Allocation, retry: float) -> list[str]:
    """Put the PF's reading of the VF's MAC back to the recorded one, zero included.

    Runs after the netdev is home, and whether or not ADD set a MAC: igb
    records whatever MAC the VF netdev programs (at ADD, when the pod closes
    it, when DEL gives it back its own MAC), so the reading drifts even when
    nothing was configured.  Writing back a zero reading empties the VF's
    filter entry; the next ADD fills it (see the module's doc).  It is
    written only when it differs, so a MAC the VF chose itself, read back
    unchanged, does not become an admin lock.
    """
    orig = alloc.original
    if orig is None or not orig.pf.mac:
        return []
    info = vfc.vfs(alloc.pf_netdev).get(alloc.vf_index)
    if info is None or info.mac == orig.pf.mac:
        return []
    try:
        _set_admin_mac(vfc, alloc.pf_netdev, alloc.vf_index, orig.pf.mac, retry)
    except netlink.InvalidArgument as exc:
        if orig.pf.mac != ZERO_MAC:
            return [f"mac: {exc}"]
        # A driver that cannot clear an admin MAC (bnxt) keeps the last one;
        # the next pod's MAC replaces it, and failing DEL would not help.
        logger.warning(
            "PF %s keeps MAC %s for VF %d: it refuses to clear it", alloc.pf_netdev, info.mac, alloc.vf_index
        )
    except (netlink.NetlinkError, CNIError) as exc:
        return [f"mac: {exc}"]
    return []


def _move(src: str | None, name: str, dst: str | None, new_name: str, link: LinkInfo | None = None) -> None:
    """Move link ``name`` from namespace ``src`` to ``dst`` as ``new_name``, in one request.

    The link's altnames are dropped first: udev gives VFs altnames that
    could clash in the pod, and a pod's own could clash in the host, where
    the kernel refuses a move that brings a name already taken (and, on
    kernels that do not check, would leave the next pod's rename to fail
    with "file exists").  Whoever moves the link back re-adds what it
    recorded.  ``None`` as a namespace means this process's own.  ``link``:
    the caller's reading of ``name`` in ``src``, if it just took one.
    """
    own = netlink.own_netns_path()
    with netlink.open_namespace(src) as ns:
        link = link or ns.find(name)
        if link is None:
            raise netlink.LinkNotFound(f"{name} not found in {src or 'the host network namespace'}")
        ns.del_altnames(link.index, link.altnames)
        try:
            ns.move(link.index, dst or own, new_name if new_name != name else None)
        except netlink.NetlinkError:
            # A refused rename can leave the link moved under its old name.
            # Only ours is moved back (the MAC goes along with a move): the
            # destination may have a link of that name of its own.
            with netlink.open_namespace(dst) as target:
                stray = target.find(name)
                if stray is not None and stray.mac == link.mac:
                    target.move(stray.index, src or own)
            back = ns.find(name)
            if back is not None:
                ns.add_altnames(back.index, link.altnames)
            raise


def into_pod(alloc: Allocation, mac: str | None, netns: str, ifname: str, retry: float) -> LinkInfo:
    """Move the VF netdev into the pod as ``ifname``, give it ``mac`` (None: its own), bring it up.

    On failure the netdev may be in the pod; :func:`restore` brings it back.
    """
    assert alloc.original is not None and alloc.in_pod
    _move(None, alloc.original.netdev, netns, ifname)
    with netlink.open_namespace(netns) as pod:
        link = pod.find(ifname)
        if link is None:
            raise CNIError(Code.DEVICE, f"{ifname} vanished from {netns} right after the move")
        if mac is not None:
            _set_effective_mac(pod, link.index, mac, retry)
        else:
            mac = _program_own_mac(pod, link)
        pod.set_up(link.index, True)
        # Bringing it up changes nothing else a caller reads, and the MAC
        # was read back when set.
        return replace(link, up=True, mac=mac)


def _program_own_mac(ns: Namespace, link: LinkInfo) -> str:
    """Have the (down) VF netdev program the MAC it has into the PF's filter; returns its MAC then.

    After a give-back the PF's filter holds no MAC for the VF (see the
    module's doc), and igbvf does not program one when it is opened again:
    it does so for a MAC change, even to the MAC it already has.
    """
    try:
        ns.set_mac(link.index, link.mac)
    except netlink.AddressRefused:
        # igbvf, while the PF holds an admin MAC that ADD did not set (one
        # set on the node before): the VF takes it when it resets, and a
        # close resets it.
        ns.set_up(link.index, True)
        ns.set_up(link.index, False)
        return ns.get(link.index).mac
    except netlink.NetlinkError as exc:
        # A VF driver that refuses even the MAC it has: the pod gets the VF
        # as it is, and CHECK tells where the PF shows the MAC missing.
        logger.warning("VF netdev %s did not take its own MAC %s again: %s", link.name, link.mac, exc)
    return link.mac


def _set_effective_mac(ns: Namespace, index: int, mac: str, retry: float) -> None:
    """Give the (down) VF netdev ``mac``, once the PF side holds it as admin MAC or none."""
    reset = False
    # After an admin MAC change the VF driver may still be resetting; the
    # netdev can show the new MAC by itself or refuse briefly.
    for _ in range(MAC_ATTEMPTS):
        if ns.get(index).mac == mac:
            return
        try:
            ns.set_mac(index, mac)
        except netlink.AddressRefused as exc:
            if not reset:
                # igbvf asks the PF for every MAC change, and once the PF
                # holds an admin MAC it refuses (EADDRNOTAVAIL); the VF only
                # adopts the admin MAC when it resets, which igbvf does when
                # an opened netdev is closed.  A VF not opened since probe
                # takes the change without asking, which is why only a VF's
                # second pod ran into this.
                ns.set_up(index, True)
                ns.set_up(index, False)
                reset = True
                continue
            logger.debug("setting MAC %s: %s; retrying", mac, exc)
        except netlink.NetlinkError as exc:
            logger.debug("setting MAC %s: %s; retrying", mac, exc)
        time.sleep(retry)
    if ns.get(index).mac != mac:
        raise CNIError(Code.DEVICE, f"the VF netdev did not take MAC {mac}")


def _identify(links: list[LinkInfo], vf_pci: str, macs: set[str], name: str) -> LinkInfo | None:
    """The VF's netdev among one namespace's ``links``, found by PCI address, never by name alone.

    The name may not be the one recorded (the kernel expands templates like
    net%d, the pod may rename it) and another interface may carry it.
    Kernels from 5.14 report each netdev's parent device; where none is
    reported (older kernels, virtual links), the VF is the parent-less link
    with one of ``macs``, preferring ``name``.
    """
    for link in links:
        if link.parent_dev == vf_pci:
            return link
    matches = [link for link in links if not link.parent_dev and link.mac in macs]
    named = [link for link in matches if link.name == name]
    best = named or matches
    return best[0] if best else None


def _find_in_pod(links: list[LinkInfo], alloc: Allocation, orig: OriginalState) -> LinkInfo | None:
    """The VF's netdev among the pod's ``links``: it has the MAC ADD gave it, or its own."""
    return _identify(links, alloc.vf_pci, {m for m in (alloc.applied.mac, orig.mac) if m}, alloc.ifname)


def _find_home_link(host: Namespace, alloc: Allocation, orig: OriginalState, sys_root: Path) -> LinkInfo | None:
    link = host.find(orig.netdev)
    # The recorded name may be another device's by now (another VF's netdev
    # took it while this one was in the pod): only a link whose parent is
    # this VF, or that reports none (older kernels, veths), is taken for it.
    if link is not None and link.parent_dev in ("", alloc.vf_pci):
        return link
    # When a pod's namespace is destroyed the kernel hands a physical netdev
    # back to the host under its pod-side name; sysfs knows it by PCI address.
    for name in sysfs.netdevs(sys_root, alloc.vf_pci):
        link = host.find(name)
        if link is not None:
            return link
    return None


def _await_home_link(host: Namespace, alloc: Allocation, orig: OriginalState, sys_root: Path) -> LinkInfo:
    """The VF's netdev once the kernel has brought it back from a deleted pod namespace."""
    deadline = time.monotonic() + HOME_WAIT
    while time.monotonic() < deadline:
        time.sleep(HOME_POLL)
        link = _find_home_link(host, alloc, orig, sys_root)
        if link is not None:
            return link
    raise CNIError(
        Code.DEVICE,
        f"VF {alloc.vf_pci} has a netdev driver but its netdev has not come back from {alloc.netns}, "
        f"whose file is gone, within {HOME_WAIT:g} s (a process may still hold that namespace)",
    )


def restore_netdev(vfc: VfControl, alloc: Allocation, retry: float, sys_root: Path) -> None:
    """Bring the VF netdev home from wherever it is and restore name, MAC, MTU, promisc, altnames.

    ``vfc`` serves only to lift an admin MAC set before ADD that the netdev
    must give up (see :func:`_restore_link`).
    """
    orig = alloc.original
    if orig is None or alloc.dpdk or not orig.netdev:
        return
    found, pod_alive = _out_of_pod(alloc, orig)
    if found is not None:
        try:
            _move(alloc.netns, found.name, None, orig.netdev, found)
        except netlink.LinkExists:
            # Another device took the VF's name on the host meanwhile: the
            # VF comes home under a free name (the kernel picks the number).
            _move(alloc.netns, found.name, None, HOME_NAME_TEMPLATE)
    with netlink.open_namespace() as host:
        # The link just moved, whatever it is called now (a move keeps the MAC).
        arrived = _identify(host.links(), alloc.vf_pci, {found.mac}, orig.netdev) if found is not None else None
        link = arrived or _home_link(host, alloc, orig, pod_alive, sys_root)
        if link is None:
            logger.warning("VF %s has no netdev in the host; nothing to restore there", alloc.vf_pci)
            return
        failures = _restore_link(vfc, host, alloc, orig, link, retry)
        if failures:
            # Read again, once, to say what the VF keeps of its pod.
            now = host.get(link.index)
            alloc.unrestored = differences(orig, now, ethtool.read(now.name) if orig.ethtool else {})
            logger.error("VF %s differs from its record after DEL: %s", alloc.vf_pci, "; ".join(alloc.unrestored))
            raise CNIError(Code.DEVICE, f"VF {alloc.vf_pci} keeps {'; '.join(alloc.unrestored)}", "; ".join(failures))
        alloc.unrestored = []


def _out_of_pod(alloc: Allocation, orig: OriginalState) -> tuple[LinkInfo | None, bool]:
    """The VF's link in the pod, set down there, if the record says it went in; and whether the pod still exists."""
    if not alloc.in_pod:
        return None, False
    try:
        with netlink.open_namespace(alloc.netns) as pod:
            links = pod.links()
            found = _find_in_pod(links, alloc, orig)
            if found is not None:
                pod.set_up(found.index, False)
                _cut_loose(pod, links, found, alloc)
            return found, True
    except netlink.NetnsNotFound:
        return None, False


def _cut_loose(pod: Namespace, links: list[LinkInfo], vf: LinkInfo, alloc: Allocation) -> None:
    """Delete what the pod built on its VF and take the VF out of any master, before the VF leaves the pod.

    A netns move does not take a VF's upper devices along, nor delete them:
    the VLAN, macvlan and ipvlan drivers keep theirs when the lower device
    only moves (they act on NETDEV_UNREGISTER only while it is really
    unregistering), and so do tunnels bound to it.  Left in place they go
    on sending through the VF and receiving its VLAN's and MAC's frames,
    whichever pod holds it next.  Bridges, bonds, teams and VRFs drop a
    port that moves away; the VF is detached here anyway, so each step is
    logged and a refusal is seen.  Raises CNIError naming what is still
    there: the VF then stays in the pod, whose end removes them all.
    """
    names = {link.index: link.name for link in links}
    left: list[str] = []
    for rider in netlink.riders(links, vf):
        what = f"{rider.kind or 'link'} {rider.name}"
        try:
            pod.delete(rider.index)
        except netlink.LinkNotFound:
            continue  # went with a link it rode, deleted just before
        except netlink.NetlinkError as exc:
            left.append(f"{what} ({exc})")
            continue
        logger.info("deleted %s, which the pod built on VF %s", what, alloc.vf_pci)
    if vf.master:
        master = names.get(vf.master, str(vf.master))
        try:
            pod.set_master(vf.index, 0)
            logger.info("took VF %s out of %s, which the pod made it a port of", alloc.vf_pci, master)
        except netlink.NetlinkError as exc:
            left.append(f"master {master} ({exc})")
    if left:
        raise CNIError(
            Code.DEVICE,
            f"VF {alloc.vf_pci} stays in {alloc.netns}: the pod's {', '.join(left)} could not be removed from it",
        )


def _home_link(
    host: Namespace, alloc: Allocation, orig: OriginalState, pod_alive: bool, sys_root: Path
) -> LinkInfo | None:
    """The VF's netdev in the host, waited for when the kernel is still handing it back; None when it has none."""
    link = _find_home_link(host, alloc, orig, sys_root)
    if (
        link is None
        and alloc.in_pod
        and not pod_alive
        and sysfs.driver(sys_root, alloc.vf_pci) not in (None, *sysfs.DPDK_DRIVERS)
    ):
        # Not home yet: until the kernel's cleanup of the pod's namespace
        # has run, the VF's netdev is in neither.  Dropping the record
        # now would leave the VF to come back later, renamed and
        # configured by the pod, with nothing to restore it from.
        link = _await_home_link(host, alloc, orig, sys_root)
    if (
        link is None
        and pod_alive
        and sysfs.pci_dir(sys_root, alloc.vf_pci).exists()
        and sysfs.driver(sys_root, alloc.vf_pci) not in (None, *sysfs.DPDK_DRIVERS)
    ):
        # The pod still exists and so does the VF with a netdev driver, yet
        # neither side shows its netdev: reporting success would drop the
        # record of a VF that may still sit in the pod.  (A VF unbound from
        # its driver while in the pod has no netdev anywhere.)
        raise CNIError(
            Code.DEVICE,
            f"VF {alloc.vf_pci} is neither in {alloc.netns} nor in the host network namespace",
        )
    return link


def _restore_link(
    vfc: VfControl, host: Namespace, alloc: Allocation, orig: OriginalState, link: LinkInfo, retry: float
) -> list[str]:
    """The VF's host netdev as recorded, from one reading (``link``): only what differs is written.

    Returns what failed; every step is tried.
    """
    failures: list[str] = []

    def attempt(step: Callable[[], object]) -> None:
        try:
            step()
        except (netlink.NetlinkError, CNIError) as exc:
            failures.append(str(exc))

    if link.up:
        attempt(lambda: host.set_up(link.index, False))
    # The pod's altnames go before the rename: one may be the recorded name.
    attempt(lambda: host.del_altnames(link.index, tuple(a for a in link.altnames if a not in orig.altnames)))
    if link.name != orig.netdev:
        attempt(lambda: _rename_home(host, link, orig.netdev))
    attempt(lambda: host.add_altnames(link.index, tuple(a for a in orig.altnames if a not in link.altnames)))
    if orig.mac and link.mac != orig.mac:
        attempt(lambda: _restore_mac(vfc, host, alloc, orig, link, retry))
    if orig.mtu and link.mtu != orig.mtu:
        attempt(lambda: host.set_mtu(link.index, orig.mtu or 0))
    flags, settings = _changed_flags(orig, link), _changed_settings(orig, link)
    if flags or settings:
        attempt(lambda: host.set_link(link.index, flags, settings))
    if link.alias != orig.alias:
        attempt(lambda: host.set_alias(link.index, orig.alias))
    # A program attached before ADD cannot be put back (its fd is gone with
    # whoever attached it); one the pod attached is detached.
    foreign = tuple(mode for mode, prog in link.xdp if prog != orig.xdp)
    if foreign:
        attempt(lambda: host.detach_xdp(link.index, foreign))
    if orig.ethtool:
        try:
            failures += ethtool.restore(orig.netdev, orig.ethtool)
        except netlink.NetlinkError as exc:
            failures.append(str(exc))
    return failures


def _rename_home(host: Namespace, link: LinkInfo, name: str) -> None:
    """The VF's recorded name again; when another device holds it now, the VF keeps the one it has, said in the log.

    Holding the VF back would not free the name, and the plugin finds a VF
    by its PCI address, never by its name.
    """
    try:
        host.rename(link.index, name)
    except netlink.LinkExists:
        logger.warning("VF netdev %s is back as %s: another device has taken %s on the host", name, link.name, name)


def _restore_mac(
    vfc: VfControl, host: Namespace, alloc: Allocation, orig: OriginalState, link: LinkInfo, retry: float
) -> None:
    if alloc.applied.mac is None and link.mac == orig.pf.mac and orig.pf.mac != ZERO_MAC:
        # The PF held an admin MAC before ADD that the netdev did not
        # carry yet; igbvf takes it when it resets (at ADD, or at a
        # new VF's first open) and then refuses any other MAC.  The
        # admin MAC goes back after, in restore_admin_mac.
        _lift_admin_mac(vfc, alloc, orig.pf.mac, retry)
    _set_effective_mac(host, link.index, orig.mac, retry)


def _recorded_flags(orig: OriginalState) -> dict[str, bool]:
    flags = dict(orig.flags)
    if orig.promisc is not None:
        flags["promisc"] = orig.promisc
    return flags


def _changed_flags(orig: OriginalState, link: LinkInfo) -> dict[str, bool]:
    return {name: on for name, on in _recorded_flags(orig).items() if link.flag(name) != on}


def _changed_settings(orig: OriginalState, link: LinkInfo) -> dict[str, int]:
    now = dict(link.settings)
    return {name: value for name, value in orig.settings.items() if name in now and now[name] != value}


def differences(orig: OriginalState, link: LinkInfo, eth: dict[str, Any]) -> list[str]:
    """How the VF's host netdev (``link``; ``eth``, its ethtool reading) differs from the record.

    One entry per setting, as "what: now (recorded)".
    """
    out = [f"name: {link.name} ({orig.netdev})"] if link.name != orig.netdev else []
    if sorted(link.altnames) != sorted(orig.altnames):
        out.append(f"altnames: {' '.join(link.altnames) or '-'} ({' '.join(orig.altnames) or '-'})")
    if orig.mac and link.mac != orig.mac:
        out.append(f"mac: {link.mac} ({orig.mac})")
    if orig.mtu and link.mtu != orig.mtu:
        out.append(f"mtu: {link.mtu} ({orig.mtu})")
    out += [
        f"{name}: {'on' if not on else 'off'} ({'on' if on else 'off'})"
        for name, on in _changed_flags(orig, link).items()
    ]
    now = dict(link.settings)
    out += [f"{name}: {now[name]} ({value})" for name, value in _changed_settings(orig, link).items()]
    if link.alias != orig.alias:
        out.append(f"alias: {link.alias!r} ({orig.alias!r})")
    out += [f"xdp: program {prog} ({orig.xdp or 'none'})" for _, prog in link.xdp if prog != orig.xdp]
    if orig.ethtool:
        out += ethtool.differences(eth, orig.ethtool)
    return out


def restore(vfc: VfControl, alloc: Allocation, retry: float, sys_root: Path) -> None:
    """Give the VF back as it was found; raises CNIError listing what could not be restored."""
    # PF side first: some drivers refuse to reset a VF's MAC through its
    # netdev while the PF still holds an untrusted admin MAC for it.
    failures = restore_pf_settings(vfc, alloc, retry)
    try:
        restore_netdev(vfc, alloc, retry, sys_root)
    except (netlink.NetlinkError, CNIError, sysfs.SysfsError) as exc:
        failures.append(f"netdev: {exc}")
    failures += restore_admin_mac(vfc, alloc, retry)
    if failures:
        raise CNIError(Code.DEVICE, f"VF {alloc.vf_pci} could not be fully restored", "; ".join(failures))
