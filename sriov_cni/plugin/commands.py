"""The ``sriov`` CNI plugin: ADD, DEL, CHECK, GC and STATUS; and the give-back of a dead pod's VF.

ADD: stdin → :mod:`config` → :mod:`allocate` (a VF claimed and recorded)
→ the record of what is about to change → PF-side settings → the RDMA
device (:mod:`rdma`) → the netdev into the pod and its tuning
(:mod:`attach`, :mod:`tuning`) → IPAM's addresses and routes → the
device-info file → the VF's carrier (:mod:`carrier`) → result.  A VF that
does not come up is rolled back and set aside (:mod:`aside`), and the
next one tried.  DEL, GC, a rollback, ADD's reclaim of a stale VF and the
daemon's healing (:func:`give_back_dead`) share one give-back sequence
(:func:`_give_back`).  :func:`run` is the injectable entry (environment,
stdin, stdout and the device/store dependencies as arguments);
:func:`main` wires it to the process.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from sriov_cni import __version__, attachments, deviceinfo, log, vfstate
from sriov_cni.cni import (
    CmdArgs,
    CNIError,
    Code,
    Handler,
    Interface,
    IPAddress,
    IPConfig,
    IPNetwork,
    Result,
    dispatch,
    parse_cni_args,
    read_config,
)
from sriov_cni.kernel import netlink, sysfs, vfsettings
from sriov_cni.kernel.netns import NamespaceError
from sriov_cni.kernel.vfsettings import PfSettings
from sriov_cni.paths import Paths
from sriov_cni.plugin import allocate, aside, attach, carrier, config, delegate, infofile, pool, rdma, tuning
from sriov_cni.plugin.config import NetConf
from sriov_cni.plugin.lease import Lease, NewLease
from sriov_cni.vfstore import Allocation, FileStore, SetAside, Store

# The executable's name, in its log lines.
PROGRAM = "sriov"
ABOUT = f"sriov CNI plugin {__version__}"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deps:
    """What the commands act on; tests substitute the PF-side VF control and shorten the waits."""

    vf_control: Callable[[], netlink.VfControl] = netlink.KernelVfControl
    store: Callable[[str], Store] = FileStore
    # How long DEL and GC wait for a VF another call is changing (an ADD still
    # running for the same attachment, typically) before answering "try again":
    # longer than any ADD should take; a holder stuck longer is a bug, and the
    # runtime retries.
    claim_wait: float = 30.0
    # Between attempts at a VF's MAC (see attach).
    mac_retry_delay: float = attach.MAC_RETRY_DELAY
    # How long ADD waits for the VF's carrier while its PF has carrier (see carrier).
    carrier_wait: float = carrier.CARRIER_WAIT
    # How long ADD goes on trying VFs after one did not come up (see aside).
    add_budget: float = aside.ADD_BUDGET
    paths: Paths = field(default_factory=Paths)


# --- records -----------------------------------------------------------------


def _find(store: Store, container_id: str, ifname: str, network: str) -> Allocation | None:
    for alloc in store.all():
        if alloc.owned_by(container_id, ifname, network):
            return alloc
    return None


# --- ADD -----------------------------------------------------------------------


def _configure_ips(netns: str, ifname: str, index: int, result: Result) -> None:
    """Addresses and routes inside the pod on link ``index`` (``ifname``), as CNI's ConfigureIface does.

    The index is the one the VF got in the pod: a link that took the name
    meanwhile does not get the VF's addresses, and a vanished one fails the
    request (LinkNotFound).
    """
    with netlink.open_namespace(netns) as pod:
        if any(ip.address.version == 6 for ip in result.ips):
            pod.set_sysctl(f"ipv6/conf/{ifname}/disable_ipv6", "0")
        gateways: dict[int, IPAddress] = {}
        for ip in result.ips:
            pod.add_address(index, ip.address)
            if ip.gateway is not None:
                gateways.setdefault(ip.address.version, ip.gateway)
        for route in result.routes:
            gw = route.gw if route.gw is not None else gateways.get(route.dst.version)
            pod.add_route(
                index,
                route.dst,
                gw,
                priority=route.priority,
                table=route.table,
                scope=route.scope,
                mtu=route.mtu,
                advmss=route.advmss,
            )


def _result(conf: NetConf, iface: Interface, ipam_result: Result | None) -> Result:
    result = conf.prev_result or Result()
    index = len(result.interfaces)
    result.interfaces.append(iface)
    if ipam_result is not None:
        result.ips += [IPConfig(ip.address, ip.gateway, index) for ip in ipam_result.ips]
        result.routes += ipam_result.routes
        if ipam_result.dns.to_dict():
            result.dns = ipam_result.dns
    if not result.dns.to_dict():
        result.dns = conf.dns
    return result


def _candidates(conf: NetConf, sys_root: Path) -> allocate.Candidates:
    if conf.device_id is not None:
        try:
            vf = sysfs.resolve_vf(sys_root, conf.device_id)
        except sysfs.SysfsError as exc:
            raise CNIError(Code.INVALID_CONFIG, f"deviceID {conf.device_id}: {exc}") from exc
        return allocate.Candidates.of_named(sysfs.describe(sys_root, vf))
    return allocate.Candidates(rdma.pool_filter(pool.pool_vfs(sys_root, conf.pool), conf.rdma, sys_root))


@dataclass(frozen=True)
class _Add:
    """One ADD's inputs, as each of its steps reads them."""

    cmd: CmdArgs
    conf: NetConf
    deps: Deps
    # The IPAM ADD running beside the VF's set-up; None without IPAM.
    ipam: delegate.IpamCall | None


def _reclaim(add: _Add, vfc: netlink.VfControl, stale: Allocation) -> None:
    """Give back a VF whose container died without DEL, as DEL does, and free its address."""
    logger.info("reclaiming VF %s from container %s (netns %s is gone)", stale.vf_pci, stale.container_id, stale.netns)
    _give_back(vfc, stale, add.deps)
    try:
        _release_address(stale, add.cmd.env)
    except CNIError as exc:
        # This ADD goes on: the address is the dead pod's network's to
        # collect (its IPAM's GC), and failing the pod would not free it.
        logger.warning("releasing the address of dead container %s: %s", stale.container_id, exc)


# The keys of a network's config an IPAM plugin's DEL reads (host-local's,
# whereabouts', sriov-ipam's), which a record keeps (see _release_address).
_IPAM_DEL_KEYS = ("cniVersion", "name", "type", "ipam")
# Bytes of them a record keeps at most: a record is read back whole only up
# to vfstore.MAX_RECORD.
MAX_IPAM_CONFIG = 16 * 1024


def _ipam_config(cmd: CmdArgs, conf: NetConf) -> dict[str, Any] | None:
    """What of the network's config its IPAM's DEL reads; None for a network without IPAM."""
    if not conf.ipam_type:
        return None
    kept = {key: cmd.conf[key] for key in _IPAM_DEL_KEYS if key in cmd.conf}
    if len(json.dumps(kept)) > MAX_IPAM_CONFIG:
        raise CNIError(Code.INVALID_CONFIG, f"the ipam section is larger than {MAX_IPAM_CONFIG} bytes")
    return kept


def _release_address(alloc: Allocation, env: Mapping[str, str]) -> None:
    """The address of an attachment whose DEL never came, released by its network's IPAM as that DEL would have.

    From the record: the network's IPAM config and the call's CNI_ARGS and
    CNI_PATH; the IPAM plugin runs in ``env`` besides those.  Raises the
    IPAM plugin's CNIError.
    """
    conf = alloc.ipam_config
    ipam = conf.get("ipam") if conf is not None else None
    ipam_type = ipam.get("type") if isinstance(ipam, dict) else None
    if conf is None or not isinstance(ipam_type, str) or not ipam_type:
        return
    dead_env = dict(
        env,
        CNI_COMMAND="DEL",
        CNI_CONTAINERID=alloc.container_id,
        CNI_NETNS="",
        CNI_IFNAME=alloc.ifname,
        CNI_ARGS=alloc.cni_args,
        CNI_PATH=alloc.cni_path,
    )
    dead = CmdArgs(
        command="DEL",
        container_id=alloc.container_id,
        netns="",
        ifname=alloc.ifname,
        args=parse_cni_args(alloc.cni_args),
        path=tuple(filter(None, alloc.cni_path.split(":"))),
        stdin=json.dumps(conf).encode(),
        conf=conf,
        cni_version=str(conf.get("cniVersion", "")),
        env=dead_env,
    )
    delegate.run_ipam("DEL", dead, ipam_type)


def _configure_log(conf: NetConf | config.Common, container_id: str, netns: str, ifname: str) -> None:
    log.configure(PROGRAM, conf.log_level, conf.log_file, container_id, netns, ifname)
    for level, msg in conf.notes:
        logger.log(level, "config: %s", msg)


def _load(cmd: CmdArgs) -> NetConf:
    conf = config.load(cmd)
    _configure_log(conf, cmd.container_id, cmd.netns, cmd.ifname)
    return conf


def _attachment(cmd: CmdArgs, conf: NetConf) -> allocate.Attachment:
    """What this ADD attaches, with the pod namespace's identity; the namespace must exist."""
    pod = (cmd.args.get("K8S_POD_NAMESPACE", ""), cmd.args.get("K8S_POD_NAME", ""), cmd.args.get("K8S_POD_UID", ""))
    return allocate.Attachment(
        cmd.container_id,
        cmd.ifname,
        conf.name,
        cmd.netns,
        _pod_netns(cmd.netns),
        pod,
        _ipam_config(cmd, conf),
        cmd.env.get("CNI_ARGS", ""),
        ":".join(cmd.path),
    )


def _pod_netns(netns: str) -> int:
    """The pod namespace's identity; it must exist."""
    inode = netlink.netns_inode(netns)
    if inode is None:
        raise CNIError(Code.INVALID_NETNS, f"network namespace {netns} does not exist")
    return inode


def _not_host(netns: str) -> None:
    if netlink.is_own_netns(netns):
        # The VF would stay in the host under the pod's name, holding the
        # pod's address after DEL gave it back.
        raise CNIError(Code.INVALID_NETNS, f"CNI_NETNS {netns} is the host's own network namespace, not a pod's")


def _refuse_recorded(att: allocate.Attachment, store: Store) -> None:
    """An ADD for an attachment that is recorded already is refused."""
    existing = _find(store, att.container_id, att.ifname, att.network)
    if existing is not None:
        raise CNIError(
            Code.INVALID_CONFIG,
            f"container {att.container_id} already has {att.ifname} on network {att.network} (VF {existing.vf_pci})",
            "DEL it first",
        )


def _refuse_taken_name(att: allocate.Attachment, candidates: allocate.Candidates) -> None:
    """An ADD whose interface name the pod uses already is refused (a VF a device plugin chose on a DPDK driver takes no name)."""
    if candidates.named is None or not candidates.named.dpdk:
        with netlink.open_namespace(att.netns) as pod:
            if pod.find(att.ifname) is not None:
                raise CNIError(Code.INVALID_CONFIG, f"interface {att.ifname} already exists in {att.netns}")


def cmd_add(cmd: CmdArgs, deps: Deps) -> Result:
    conf = _load(cmd)
    att = _attachment(cmd, conf)
    store = deps.store(conf.data_dir)
    _refuse_recorded(att, store)
    candidates = _candidates(conf, deps.paths.sys)
    _not_host(att.netns)
    # IPAM starts once the config has named VFs that exist and this is a new
    # attachment, and runs while the VF is chosen and set up: a Go IPAM
    # plugin takes about as long as all of that.  Not before: a failed ADD
    # releases what IPAM holds for this container and interface, which must
    # not be a live attachment's.
    add = _Add(cmd, conf, deps, delegate.IpamCall("ADD", cmd, conf.ipam_type) if conf.ipam_type else None)
    try:
        return _add(add, att, store, candidates)
    except BaseException:
        # Waits for an IPAM ADD still running, and releases what it reserved.
        if add.ipam is not None and add.ipam.succeeded():
            try:
                delegate.run_ipam("DEL", cmd, add.ipam.ipam_type)
            except CNIError as exc:
                logger.error("rollback: releasing the address: %s", exc)
        raise


def _add(add: _Add, att: allocate.Attachment, store: Store, candidates: allocate.Candidates) -> Result:
    _refuse_taken_name(att, candidates)
    vfc = add.deps.vf_control()
    set_aside = store.aside()
    if candidates.named is None:
        candidates = allocate.Candidates(aside.ordered(candidates.vfs, set_aside, time.time()))
    started = time.monotonic()
    failed: list[str] = []
    with netlink.open_namespace() as host:
        while True:
            # The claim is held until this ADD has returned or rolled back: a
            # DEL or another ADD reclaiming the VF (its pod's netns may
            # vanish meanwhile) waits.
            with _reserve(add, att, store, candidates, host, set_aside, failed) as lease:
                alloc = lease.alloc
                logger.info("allocated VF %s (PF %s VF %d)", alloc.vf_pci, alloc.pf_netdev, alloc.vf_index)
                try:
                    result = _set_up(add, vfc, host, lease)
                except aside.VfUnusable as exc:
                    _roll_back(vfc, lease, add.deps)
                    aside.set_aside(store, alloc, exc, set_aside.get(alloc.vf_pci))
                    if candidates.named is not None:
                        raise
                    failed.append(f"VF {alloc.vf_pci}: {exc.msg}")
                    if time.monotonic() - started + add.deps.carrier_wait > add.deps.add_budget:
                        raise _none_came_up(failed, f"tried for {time.monotonic() - started:.0f} s") from exc
                    candidates = allocate.Candidates([vf for vf in candidates.vfs if vf.pci != alloc.vf_pci])
                    continue
                except BaseException:
                    _roll_back(vfc, lease, add.deps)
                    raise
                aside.came_back(store, alloc.vf_pci, set_aside)
                return result


def _reserve(
    add: _Add,
    att: allocate.Attachment,
    store: Store,
    candidates: allocate.Candidates,
    host: netlink.Namespace,
    set_aside: dict[str, SetAside],
    failed: list[str],
) -> NewLease:
    """:func:`allocate.reserve`, its "no free VF" naming the VFs this ADD tried and those set aside."""
    try:
        return allocate.reserve(store, candidates, att, host, add.deps.paths)
    except CNIError as exc:
        if exc.code != Code.NO_FREE_VF:
            raise
        if failed:
            raise _none_came_up(failed, "no other VF is free") from exc
        passed = [
            f"{pci} ({record.reason}, passed over until {time.strftime('%H:%M:%S', time.localtime(record.retry_after))})"
            for pci, record in set_aside.items()
            if pci not in {vf.pci for vf in candidates.vfs}
        ]
        if passed:
            exc.details = "; ".join(filter(None, [exc.details, "set aside: " + ", ".join(passed)]))
        raise


def _none_came_up(failed: list[str], why_stop: str) -> CNIError:
    return CNIError(
        Code.DEVICE,
        f"no VF came up in the pod ({why_stop}); each was set aside",
        "; ".join(failed),
    )


def _set_up(add: _Add, vfc: netlink.VfControl, host: netlink.Namespace, lease: NewLease) -> Result:
    """ADD's phases on the VF it holds, in order; whatever they changed, :func:`_roll_back` undoes from the record."""
    conf, deps = add.conf, add.deps
    if lease.stale is not None:
        _reclaim_stale(add, vfc, lease.stale)
    # Saved with the changes' record: the daemon's NRI plugin reads it when
    # the pod's containers are created.
    lease.alloc.rdma_memlock = conf.rdma_memlock
    _record_changes(vfc, host, lease, conf.pf_settings)
    aside.refuse_disabled_link(lease.alloc, conf.pf_settings.link_state)
    if not lease.alloc.dpdk:
        # Recorded first, so a restore puts the netdev back whatever the
        # open left; before the PF-side settings, so the VF is as recorded.
        carrier.train(deps.paths.sys, lease.alloc)
    attach.apply_pf_settings(vfc, lease.alloc, deps.mac_retry_delay)
    # Read once: the move and the device-info file go by the same reading.
    listed = rdma.listed(lease.alloc, deps.paths.sys)
    rdma_device = rdma.move_in(lease, conf.rdma, deps.paths.sys, listed)
    iface, index = _plug(conf, lease, deps)
    rdma_device = rdma.make_soft(lease, conf.rdma) or rdma_device
    if rdma_device is not None:
        logger.info("the pod's RDMA device: %s", rdma_device)
    ipam_result = _address(lease.alloc, index, add.ipam)
    if conf.device_info_file is not None:
        _publish(conf.device_info_file, lease, deps.paths.sys, listed, rdma_device, ipam_result)
    if index is not None:
        # Last: the VF's driver trains its link (seconds on a VF's first
        # open) while the addresses, routes and device-info are set.
        carrier.await_carrier(deps.paths.sys, lease.alloc, index, deps.carrier_wait)
    return _result(conf, iface, ipam_result)


def _publish(
    path: str, lease: NewLease, sys_root: Path, listed: list[str], rdma_device: str | None, addressed: Result | None
) -> None:
    """The device-info file, with the RoCE v2 GID index of the pod's address on its RDMA device.

    That index waits for the kernel (up to :data:`rdma.GID_WAIT`): it adds
    an address's GIDs from a work item, after the address is set.
    """
    alloc = lease.alloc
    ours = deviceinfo.facts(sys_root, alloc.vf_pci, alloc.pf_pci, rdma_device, listed)
    addresses = [ip.address.ip for ip in addressed.ips] if addressed is not None else []
    infofile.publish(path, lease, ours, lambda device: rdma.gid_index(alloc, device, addresses, sys_root))


def _reclaim_stale(add: _Add, vfc: netlink.VfControl, stale: Allocation) -> None:
    """The dead container's VF put back and its address freed, before this ADD changes anything."""
    _reclaim(add, vfc, stale)
    if add.ipam is not None and not add.ipam.succeeded():
        # It ran before the dead container's address was freed, which a
        # full range needed.
        add.ipam.again()


def _record_changes(vfc: netlink.VfControl, host: netlink.Namespace, lease: NewLease, wanted: PfSettings) -> None:
    """Record the VF's state and the PF-side settings about to change, before changing either.

    After a crash at any later point the record still restores everything.
    """
    alloc = lease.alloc
    if alloc.original is None:
        alloc.original = attach.snapshot(vfc, host, alloc, lease.vf)
    alloc.applied = wanted
    lease.save()


def _plug(conf: NetConf, lease: NewLease, deps: Deps) -> tuple[Interface, int | None]:
    """The pod's interface, and its link's index in the pod (None for a VF on a DPDK driver)."""
    if lease.alloc.dpdk:
        return _dpdk_interface(conf, lease.alloc), None
    return _attach(conf, lease, deps)


def _dpdk_interface(conf: NetConf, alloc: Allocation) -> Interface:
    """A VF on a DPDK driver has no netdev: the pod gets its PCI address."""
    assert alloc.original is not None
    admin = alloc.original.pf.mac
    mac = conf.pf_settings.mac or (admin if admin and admin != vfsettings.ZERO_MAC else "")
    return Interface(name=alloc.ifname, mac=mac, sandbox=alloc.netns, pci_id=alloc.vf_pci)


def _attach(conf: NetConf, lease: NewLease, deps: Deps) -> tuple[Interface, int]:
    """The VF's netdev into the pod, configured and tuned; with its index there."""
    alloc = lease.alloc
    # Recorded first: only a record that says so lets a restore take an
    # interface out of the pod's namespace.
    alloc.in_pod = True
    lease.save()
    link = attach.into_pod(alloc, conf.pf_settings.mac, alloc.netns, alloc.ifname, deps.mac_retry_delay)
    # A VF's queue IRQs exist only while it is up, and the move closed it:
    # the node's tuning is applied now, not at setup.
    for warning in tuning.apply_vf_tuning(deps.paths, lease.vf, alloc.netns, alloc.ifname):
        logger.warning("tuning: %s", warning)
    return Interface(alloc.ifname, link.mac, link.mtu, alloc.netns, pci_id=alloc.vf_pci), link.index


def _address(alloc: Allocation, index: int | None, ipam: delegate.IpamCall | None) -> Result | None:
    """IPAM's answer, its addresses and routes set on the pod's link ``index`` (a DPDK VF has none)."""
    if ipam is None:
        return None
    result = ipam.result()
    assert result is not None
    if not result.ips:
        raise CNIError(Code.IPAM, f"IPAM plugin {ipam.ipam_type} returned no IP address")
    if index is not None:
        _configure_ips(alloc.netns, alloc.ifname, index, result)
    return result


def _roll_back(vfc: netlink.VfControl, lease: Lease, deps: Deps) -> None:
    try:
        _give_back(vfc, lease.alloc, deps)
    except CNIError as exc:
        # Keep the record: the runtime's DEL after this failed ADD retries.
        logger.error("rollback: %s", exc)
        return
    lease.forget()


# --- DEL, GC -------------------------------------------------------------------


def _give_back(vfc: netlink.VfControl, alloc: Allocation, deps: Deps) -> None:
    """The VF as it was found, tuning included: DEL's, GC's, rollback's and stale reclaim's one sequence.

    Every step is tried, whatever an earlier one met (a VF whose RDMA
    device cannot be moved back still has its netdev to give back); raises
    CNIError naming each failure.
    """
    steps: list[Callable[[], None]] = [
        # Before the netdev leaves the pod (see plugin/rdma.py).
        lambda: rdma.give_back(alloc, deps.paths.sys),
        lambda: attach.restore(vfc, alloc, deps.mac_retry_delay, deps.paths.sys),
        lambda: infofile.withdraw(alloc),
    ]
    if not alloc.dpdk:
        # Before the move out of the pod: the move closes the VF, and igbvf
        # frees its vectors then, after which affinity writes are ignored.
        netns = alloc.netns if alloc.in_pod else None
        steps.insert(1, lambda: tuning.clear_vf_tuning(deps.paths, alloc.vf_pci, netns, alloc.ifname))
    errors: list[CNIError] = []
    for step in steps:
        try:
            step()
        except CNIError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    _raise_collected(f"giving back VF {alloc.vf_pci}", errors)


def _free_vf(
    vfc: netlink.VfControl, store: Store, alloc: Allocation, deps: Deps, released: Callable[[], object] = lambda: None
) -> None:
    """DEL's and GC's give-back under the VF's claim (waited for ``deps.claim_wait``): the VF restored, its record gone.

    ``released`` runs once the VF is back, before its record goes: DEL
    waits there for its IPAM DEL, so a DEL killed before the address is
    released leaves the record, for the runtime's next DEL or the daemon
    (once the pod is gone) to release it.
    """
    claim = store.claim(alloc.vf_pci, wait=deps.claim_wait)
    if claim is None:
        raise CNIError(
            Code.TRY_AGAIN, f"VF {alloc.vf_pci} stayed claimed by another CNI call for {deps.claim_wait:g} s"
        )
    with Lease(store, alloc, claim) as lease:
        if not lease.owned():
            # An ADD reclaimed the VF (its pod's netns was gone) while this
            # call waited; it is that ADD's now, already put back.
            logger.info("VF %s was reclaimed by another container meanwhile; nothing to give back", alloc.vf_pci)
            return
        # As recorded now: this attachment's ADD may have run on while this
        # call waited for its claim.
        try:
            _give_back(vfc, lease.alloc, deps)
        except CNIError:
            # The record stays, with what the VF kept of its pod
            # (alloc.unrestored), for `sriov-cni status` to show.
            lease.save()
            raise
        released()
        lease.forget()
    logger.info("gave back VF %s", alloc.vf_pci)


def give_back_dead(store: Store, seen: Allocation, deps: Deps, env: Mapping[str, str]) -> str | None:
    """The VF of a pod that died without DEL (``seen``, its record as read), given back as DEL would, address and all.

    The daemon's healing (see sriov_cni.daemon.heal).  Under the VF's
    claim, taken without waiting: its holder is a DEL or an ADD, which deal
    with the VF themselves.  Only while the record is still ``seen``'s and
    its namespace still gone; marked as being given back first, for
    ``status``.  Returns why the pod was gone ("netns gone", "earlier
    boot"), None when nothing was done; raises CNIError when the give-back
    or the address's release failed (the record stays, with what the VF
    kept, for the next try).
    """
    claim = store.claim(seen.vf_pci)
    if claim is None:
        return None
    with Lease(store, seen, claim) as lease:
        current = store.get(seen.vf_pci)
        why = (
            None
            if current is None or not allocate.same_attachment(current, seen)
            else vfstate.gone(current, deps.paths.proc)
        )
        if current is None or why is None:
            return None
        lease.alloc = current
        if current.giving_back != why:
            current.giving_back = why
            lease.save()
        try:
            _give_back(deps.vf_control(), current, deps)
            # Before the record goes, as DEL releases it: a record gone is
            # an address released, and a failed release is tried again.
            _release_address(current, env)
        except CNIError:
            lease.save()
            raise
        lease.forget()
    return why


def _raise_collected(what: str, errors: list[CNIError]) -> None:
    if errors:
        raise CNIError(errors[0].code, f"{what} incomplete", "; ".join(str(e) for e in errors))


def cmd_del(cmd: CmdArgs, deps: Deps) -> None:
    # Best effort: only what DEL needs is read, so a config that ADD
    # rejected still cleans up, and every step runs even if one fails.
    common = config.load_common(cmd)
    _configure_log(common, cmd.container_id, cmd.netns, cmd.ifname)
    errors: list[CNIError] = []
    # Runs while the VF is given back, and is waited for however that ends:
    # an IPAM DEL finishing after the answer would race the runtime's next
    # ADD for this container and release the address it got.
    ipam = delegate.IpamCall("DEL", cmd, common.ipam_type) if common.ipam_type else None
    try:
        store = deps.store(common.data_dir)
        alloc = _find(store, cmd.container_id, cmd.ifname, str(cmd.conf["name"]))
        if alloc is None:
            logger.info("no VF is allocated to this attachment; nothing to give back")
        else:
            try:
                # Waited for before the record goes; its outcome is read below.
                _free_vf(deps.vf_control(), store, alloc, deps, ipam.succeeded if ipam is not None else lambda: None)
            except CNIError as exc:
                errors.append(exc)
    finally:
        if ipam is not None:
            try:
                ipam.result()
            except CNIError as exc:
                errors.insert(0, exc)
    _raise_collected("DEL", errors)


def cmd_gc(cmd: CmdArgs, deps: Deps) -> None:
    common = config.load_common(cmd)
    _configure_log(common, "-", "-", "-")
    # Before anything is released: an unreadable list must release nothing.
    valid = attachments.valid_attachments(cmd.conf)
    store = deps.store(common.data_dir)
    vfc = deps.vf_control()
    errors: list[CNIError] = []
    for alloc in store.all():
        if alloc.network == cmd.conf["name"] and (alloc.container_id, alloc.ifname) not in valid:
            try:
                _free_vf(vfc, store, alloc, deps)
            except CNIError as exc:
                errors.append(exc)
    if common.ipam_type:
        try:
            delegate.run_ipam("GC", cmd, common.ipam_type)
        except CNIError as exc:
            errors.append(exc)
    _raise_collected("GC", errors)


# --- CHECK, STATUS -------------------------------------------------------------------


def cmd_check(cmd: CmdArgs, deps: Deps) -> None:
    conf = _load(cmd)
    prev = conf.prev_result
    if prev is None:
        raise CNIError(Code.INVALID_CONFIG, "CHECK needs prevResult")
    _pod_netns(cmd.netns)
    _not_host(cmd.netns)
    alloc = _find(deps.store(conf.data_dir), cmd.container_id, cmd.ifname, conf.name)
    if alloc is None:
        raise CNIError(Code.DEVICE, f"no VF is recorded for {cmd.ifname} of container {cmd.container_id}")
    index = next(
        (i for i, itf in enumerate(prev.interfaces) if itf.name == cmd.ifname and itf.sandbox == cmd.netns), None
    )
    if index is None:
        raise CNIError(Code.INVALID_CONFIG, f"prevResult has no interface {cmd.ifname} in {cmd.netns}")
    problems: list[str] = []
    pod_link = None
    if not alloc.dpdk:
        pod_link, problems = _pod_problems(cmd, prev, index)
    problems += _pf_problems(deps, alloc, pod_link)
    problems += rdma.check(alloc)
    if problems:
        raise CNIError(Code.DEVICE, f"{cmd.ifname} in {cmd.netns} does not match", "; ".join(problems))
    if conf.ipam_type:
        delegate.run_ipam("CHECK", cmd, conf.ipam_type)


def _pod_problems(cmd: CmdArgs, prev: Result, index: int) -> tuple[netlink.LinkInfo, list[str]]:
    """The pod's interface ``index`` of ``prev`` as the pod has it now, and where it differs."""
    expected = prev.interfaces[index]
    problems: list[str] = []
    with netlink.open_namespace(cmd.netns) as pod:
        link = pod.find(cmd.ifname)
        if link is None:
            raise CNIError(Code.DEVICE, f"{cmd.ifname} is missing from {cmd.netns}")
        if expected.mac and link.mac != expected.mac.lower():
            problems.append(f"MAC is {link.mac}, expected {expected.mac}")
        if expected.mtu and link.mtu != expected.mtu:
            problems.append(f"MTU is {link.mtu}, expected {expected.mtu}")
        if not link.up:
            problems.append("link is down")
        problems += _rider_problems(pod.links(), link)
        have = set(pod.addresses(link.index))
        for ip in prev.ips:
            if ip.interface == index and ip.address not in have:
                problems.append(f"address {ip.address} is missing")
        # By destination: a prevResult of many routes was compared with each
        # of the pod's routes in turn (prevResult x pod routes).
        gateways: dict[IPNetwork, set[IPAddress | None]] = {}
        for dst, gw in pod.routes(link.index):
            gateways.setdefault(dst, set()).add(gw)
        for route in prev.routes:
            via = gateways.get(route.dst)
            if via is None or (route.gw is not None and route.gw not in via):
                problems.append(f"route {route.dst} via {route.gw or 'link'} is missing")
    return link, problems


def _rider_problems(links: list[netlink.LinkInfo], vf: netlink.LinkInfo) -> list[str]:
    """What the pod built on its VF: its right while it holds the VF, and gone at DEL (see attach)."""
    problems = [
        f"{rider.kind or 'link'} {rider.name} rides it (DEL deletes it before the VF leaves)"
        for rider in netlink.riders(links, vf)
    ]
    if vf.master:
        master = next((link.name for link in links if link.index == vf.master), str(vf.master))
        problems.append(f"it is a port of {master} (DEL takes it out before the VF leaves)")
    return problems


def _pf_problems(deps: Deps, alloc: Allocation, pod_link: netlink.LinkInfo | None) -> list[str]:
    """Where the PF's view of the VF differs from what ADD applied (and from the pod's MAC)."""
    info = deps.vf_control().vfs(alloc.pf_netdev).get(alloc.vf_index)
    if info is None:
        return [f"PF {alloc.pf_netdev} no longer has VF {alloc.vf_index}"]
    problems = []
    for key, value in alloc.applied.items():
        actual = getattr(info, key)
        if actual is not None and actual != value:
            problems.append(f"VF {key} is {actual}, expected {value}")
    if pod_link is not None and alloc.applied.mac is None:
        problems += _unreceived_mac(alloc, info.mac, pod_link, deps.paths.sys)
    if pod_link is not None:
        problems += carrier.problems(deps.paths.sys, alloc, pod_link)
    return problems


def _unreceived_mac(alloc: Allocation, reading: str | None, pod_link: netlink.LinkInfo, sys_root: Path) -> list[str]:
    """The PF's MAC for the VF, where it shows that the VF cannot receive its pod MAC's traffic.

    With a ``mac`` the reading is compared with it like every applied
    setting; without one, it should be the MAC the VF programmed (see
    :mod:`sriov_cni.plugin.attach`).  A zero reading says so only on PF
    drivers that report the VF's own MAC in it, and only once the VF has
    carrier: a new igbvf VF gets its MAC to the PF only when it first
    resets, seconds after it is opened, and reports carrier after that.
    """
    if not reading or reading == pod_link.mac:
        return []
    if reading == vfsettings.ZERO_MAC and (
        not pod_link.carrier or sysfs.driver(sys_root, alloc.pf_pci) not in vfsettings.OWN_MAC_IN_READING
    ):
        return []
    return [
        f"PF {alloc.pf_netdev} holds MAC {reading} for VF {alloc.vf_index}, not {pod_link.mac}: "
        "the VF does not receive the pod's unicast traffic"
    ]


def cmd_status(cmd: CmdArgs, deps: Deps) -> None:
    conf = config.load(cmd)
    _configure_log(conf, "-", "-", "-")
    if conf.pool and conf.device_id is None:
        try:
            vfs = pool.pool_vfs(deps.paths.sys, conf.pool)
        except CNIError as exc:
            raise CNIError(Code.NOT_AVAILABLE, "the VF pool is unusable", exc.msg) from exc
        store = deps.store(conf.data_dir)
        # What ADD would try: VFs set aside count once their back-off has ended.
        vfs = aside.ordered(vfs, store.aside(), time.time())
        with netlink.open_namespace() as host:
            states = [
                vfstate.vf_state(deps.paths, vf.pci, store.get(vf.pci), lambda name: host.find(name) is not None)
                for vf in vfs
            ]
        usable = sum(s in (vfstate.VfState.FREE, vfstate.VfState.STALE) for s in states)
        if usable == 0:
            raise CNIError(
                Code.NOT_AVAILABLE,
                f"no free VF in the pool {', '.join(str(e) for e in conf.pool)}",
                f"{len(vfs)} VFs that are not set aside, all allocated or in use",
            )
    if conf.ipam_type:
        delegate.run_ipam("STATUS", cmd, conf.ipam_type)


# --- entry points --------------------------------------------------------------


def _device_errors(fn: Callable[[CmdArgs, Deps], Result | None], deps: Deps) -> Handler:
    @functools.wraps(fn)
    def handler(cmd: CmdArgs) -> Result | None:
        try:
            return fn(cmd, deps)
        except netlink.NetnsNotFound as exc:
            raise CNIError(Code.INVALID_NETNS, str(exc)) from exc
        except (netlink.NetlinkError, NamespaceError, sysfs.SysfsError) as exc:
            raise CNIError(Code.DEVICE, str(exc)) from exc

    return handler


COMMANDS: dict[str, Callable[[CmdArgs, Deps], Result | None]] = {
    "ADD": cmd_add,
    "DEL": cmd_del,
    "CHECK": cmd_check,
    "GC": cmd_gc,
    "STATUS": cmd_status,
}


def run(env: Mapping[str, str], stdin: bytes, stdout: IO[str], stderr: IO[str], deps: Deps = Deps()) -> int:
    # One VF control per invocation, closed at the end: the kernel one holds
    # a netlink socket, which in-process callers would otherwise leak.
    opened: list[netlink.VfControl] = []

    def vf_control() -> netlink.VfControl:
        if not opened:
            opened.append(deps.vf_control())
        return opened[0]

    scoped = replace(deps, vf_control=vf_control)
    handlers = {name: _device_errors(fn, scoped) for name, fn in COMMANDS.items()}
    try:
        with netlink.session():
            return dispatch(handlers, env, stdin, stdout, stderr, ABOUT)
    finally:
        close = getattr(opened[0], "close", None) if opened else None
        if callable(close):
            close()


def main() -> None:
    log.configure_from_env(PROGRAM, os.environ)
    sys.exit(run(os.environ, read_config(sys.stdin.buffer), sys.stdout, sys.stderr))
