"""Choosing a VF for a container, race-free, and recording the choice.

A free VF is taken first; a stale one (see :mod:`sriov_cni.vfstate`) may
be reclaimed after it is put back the way it was.

What makes the choice race-free is the VF's claim (see
:mod:`sriov_cni.vfstore`): a VF is recorded only under its claim, and
under it the VF is checked again.  VFs are judged without their claims
(from the list of recorded VFs and sysfs; a stale one from its record), so
by the time a call has a VF's claim, the call that held it before may have
recorded the VF, reclaimed it or given it back.  A VF is taken only if,
under the claim, it still has no record, or still the stale record it was
chosen by.  So two ADDs never take the same VF (the failure of the first
self-allocating SR-IOV plugins, which scanned sysfs and moved the VF with
nothing held), and ADDs of different VFs never wait for each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel import netns, sysfs
from sriov_cni.paths import Paths
from sriov_cni.plugin.lease import NewLease
from sriov_cni.vfstate import VfState, netns_alive, recorded_state, unrecorded_state
from sriov_cni.vfstore import Allocation, Store


@dataclass(frozen=True)
class Attachment:
    """The attachment one ADD is for: container, interface, network, and the pod's namespace.

    ``netns_inode`` tells the namespace apart from a later one at the same
    path, so a record of a dead pod is never taken for a live one.
    """

    container_id: str
    ifname: str
    network: str
    netns: str
    netns_inode: int | None
    # The pod's namespace, name and UID from CNI_ARGS, where the runtime gives them.
    pod: tuple[str, str, str] = ("", "", "")
    # What releasing the attachment's address takes without a DEL (see
    # Allocation.ipam_config).
    ipam_config: dict[str, Any] | None = None
    cni_args: str = ""
    cni_path: str = ""


@dataclass(frozen=True)
class Candidates:
    """The VFs an ADD may take, in order.

    ``named`` is the one VF a device plugin chose (deviceID), described when
    its address was resolved; ``vfs`` is then that VF alone.  A pool's VFs
    are described when they are judged.
    """

    vfs: list[sysfs.VF]
    named: sysfs.VfDevice | None = None

    @classmethod
    def of_named(cls, vf: sysfs.VfDevice) -> Candidates:
        return cls([vf], vf)


class Host(Protocol):
    """The host network namespace, as far as telling whether a netdev is there goes."""

    def find(self, name: str) -> object | None: ...


def _judged(device: sysfs.VfDevice, in_host: Callable[[str], bool]) -> VfState:
    return unrecorded_state(device.driver, device.netdev, in_host)


def _unrecorded_free(
    sys_root: Path, candidates: Candidates, taken: AbstractSet[str], in_host: Callable[[str], bool]
) -> Iterator[sysfs.VfDevice]:
    """The free VFs among those without a record, judged without reading any record.

    Records are read only when none is free (a stale one to reclaim, or the
    owners to name), so one allocation costs the same however many VFs of
    the pool are taken.  Each VF is described (sysfs read) once here, and
    the description of the one taken serves the whole ADD.
    """
    for vf in candidates.vfs:
        if vf.pci in taken:
            continue
        device = candidates.named or sysfs.describe(sys_root, vf)
        if _judged(device, in_host) is VfState.FREE:
            yield device


def reserve(store: Store, candidates: Candidates, attachment: Attachment, host: Host, paths: Paths) -> NewLease:
    """Take the first free VF among ``candidates``, claim it and record it for ``attachment``.

    A stale VF (its container died without DEL) is taken only when no VF is
    free; the caller must put it back as it was before using it.  A VF whose
    claim another call holds (an ADD taking it, a DEL giving it back) is
    passed over.  Failure messages speak of the named VF, or of the pool.
    ``paths``: the node's sysfs (the candidates were read from it) and procfs.
    """

    def in_host(name: str) -> bool:
        return host.find(name) is not None

    # The common case reads no record: the first VF that looks free, whose
    # claim no other call holds and which still has no record, is taken.
    for device in _unrecorded_free(paths.sys, candidates, store.ids(), in_host):
        taken = _take(store, device, attachment, None, paths.proc)
        if isinstance(taken, NewLease):
            return taken
    # No VF that looked free could be taken.  The records are read, to
    # reclaim a stale VF or to name the owners; a VF given back since the
    # first look is taken here, so sysfs is read again for it.
    recorded = store.ids()
    stale: list[tuple[sysfs.VF, Allocation]] = []
    owners: list[str] = []
    for vf in candidates.vfs:
        alloc = store.get(vf.pci) if vf.pci in recorded else None
        if alloc is None:
            device = sysfs.describe(paths.sys, vf)
            if _judged(device, in_host) is not VfState.FREE:
                owners.append(f"{vf.pci} (its netdev is not in the host network namespace)")
                continue
            taken = _take(store, device, attachment, None, paths.proc)
            if isinstance(taken, NewLease):
                return taken
            owners.append(f"{vf.pci} ({taken})")
        elif recorded_state(alloc, paths.proc) in (VfState.STALE, VfState.GIVING_BACK):
            stale.append((vf, alloc))
        else:
            owners.append(f"{vf.pci} (container {alloc.container_id}, netns {alloc.netns})")
    for vf, old in stale:
        taken = _take(store, sysfs.describe(paths.sys, vf), attachment, old, paths.proc)
        if isinstance(taken, NewLease):
            return taken
        owners.append(f"{vf.pci} ({taken})")
    if candidates.named is not None:
        raise CNIError(Code.NO_FREE_VF, f"VF {owners[0]} is not free" if owners else "VF is not free")
    raise CNIError(
        Code.NO_FREE_VF,
        f"no free VF in the pool ({len(candidates.vfs)} VFs, all taken)",
        "; ".join(owners),
    )


def _record(vf: sysfs.VfDevice, attachment: Attachment) -> Allocation:
    """The new record of ``vf`` given to ``attachment``, before anything is changed."""
    if not vf.pf.netdev:
        raise CNIError(Code.DEVICE, f"PF {vf.pf.pci} of VF {vf.pci} has no netdev to configure VFs through")
    return Allocation(
        vf_pci=vf.pci,
        pf_pci=vf.pf.pci,
        pf_netdev=vf.pf.netdev,
        vf_index=vf.index,
        network=attachment.network,
        container_id=attachment.container_id,
        ifname=attachment.ifname,
        netns=attachment.netns,
        netns_inode=attachment.netns_inode,
        dpdk=vf.dpdk,
        pod_namespace=attachment.pod[0],
        pod_name=attachment.pod[1],
        pod_uid=attachment.pod[2],
        boot_id=netns.boot_id(),
        ipam_config=attachment.ipam_config,
        cni_args=attachment.cni_args,
        cni_path=attachment.cni_path,
    )


def same_attachment(a: Allocation, b: Allocation) -> bool:
    """Whether two records are of one attachment (one ADD), whatever that ADD recorded since."""
    return (a.container_id, a.ifname, a.network, a.netns, a.netns_inode, a.created) == (
        b.container_id,
        b.ifname,
        b.network,
        b.netns,
        b.netns_inode,
        b.created,
    )


def _take(
    store: Store, vf: sysfs.VfDevice, attachment: Attachment, old: Allocation | None, proc: Path
) -> NewLease | str:
    """``vf`` claimed and recorded for ``attachment``; or why not, as the "no free VF" error says it.

    ``old`` is the stale record the VF was chosen by, None for a VF chosen
    as free; ``proc``: the node's procfs, to tell that its namespace is gone.
    """
    claim = store.claim(vf.pci)
    if claim is None:
        if old is not None:
            return "another CNI call is giving it back"
        return "another CNI call is taking or giving it back"
    try:
        # The VF was judged without its claim, and whoever held the claim
        # since may have recorded the VF (an ADD), reclaimed it (an ADD
        # replacing the stale record) or given it back (a DEL or GC,
        # removing the record).  Recording it on the strength of that
        # judgement would give one VF to two pods, or restore a VF from a
        # record that is no longer its own.
        if old is None:
            stale = None
            if store.has(vf.pci):
                claim.drop()
                return "taken by another CNI call meanwhile"
        else:
            stale = store.get(vf.pci)
            if stale is None or not same_attachment(stale, old) or netns_alive(stale, proc):
                claim.drop()
                return "given back or reclaimed by another CNI call meanwhile"
        new = _record(vf, attachment)
        if stale is not None:
            # The VF is still dirty from the dead container: its original
            # state is the stale record's, not what we would snapshot now.
            # The record as read now, under the claim: the dead container's
            # own ADD may have recorded more after the first read.
            new.original = stale.original
        store.put(new)
    except BaseException:
        claim.drop()
        raise
    return NewLease(store, new, claim, vf, stale)
