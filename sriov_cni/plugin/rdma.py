"""The VF's RDMA device and the pod: ADD's steps, their undo, CHECK's look.

The network's ``rdma`` key says what happens:

``auto`` (the default)
    A VF with an RDMA device (``<VF>/infiniband/<name>``: mlx5, irdma,
    bnxt_re...) has it moved into the pod when the node's RDMA netns mode is
    exclusive; in shared mode nothing moves (every namespace sees every
    device) and the log says, once per process, that pods are not
    isolated.  A VF without one is attached as any other.  A VF whose
    device lives in another namespace (another tool moved it there, or a
    pod still holds it) is not taken: a self-allocating ADD sets it aside
    and tries the next VF (see :mod:`aside`).
``required``
    As ``auto``, but a VF without exactly one RDMA device is refused, and so
    is shared mode: the pod would not hold the device alone.
``off``
    The RDMA device, if any, is left where it is.
``soft``
    A Soft-RoCE (rxe) device is made on the pod's VF netdev, inside the
    pod, and removed on DEL: the verbs API on a NIC without RDMA hardware.

Order: in ADD the RDMA device moves *before* the netdev, so a driver that
cannot move it (EOPNOTSUPP: efa, siw, rxe before Linux 7.3) is refused with
nothing moved; DEL moves it back first too, from inside the pod (the kernel
only finds a device from a socket in its namespace), before the netdev
leaves.  The two moves do not depend on each other in the kernel; the
teardown order is the one RDMA users found needed, and ADD's rollback uses
DEL's code.  A soft device is made once the netdev is in the pod, on it.

The record (``rdma_device``, ``rdma_index``, ``rdma_soft``) is saved before
each change, so a DEL or a GC after a crash knows what to undo.  The device
is found again by its index, which no move or rename changes: the pod may
rename it (``rdma dev set ... name``: its CAP_NET_ADMIN is enough), and the
kernel renames it ``ibdevN`` when it comes back from a dead namespace to a
host where its name is taken.  DEL gives it back under the name it had.

A VF's InfiniBand link layer is refused: moving its RDMA device re-creates
its IPoIB netdev, and an IB VF needs node and port GUIDs this plugin does
not set (ib-sriov-cni does both).

The pod is told its device's RoCE v2 GID index for its address (see
:func:`gid_index`): what ``NCCL_IB_GID_INDEX`` and perftest's ``-x`` take.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path

from sriov_cni.cni import CNIError, Code, IPAddress
from sriov_cni.kernel import netns, nlerrors, rdma, sysfs
from sriov_cni.plugin import aside
from sriov_cni.plugin.lease import Lease, NewLease
from sriov_cni.vfstore import Allocation

logger = logging.getLogger(__name__)

# A dead pod's RDMA devices come back to the host from the kernel's
# namespace cleanup work, within about a second; DEL waits this long for it
# before answering "try again".
RETURN_WAIT = 10.0
# The kernel adds an address's GIDs from a work item, within milliseconds of
# the address; only a fault (or no RoCE on the netdev) keeps it this long.
GID_WAIT = 10.0
# ARPHRD_INFINIBAND, a netdev's sysfs ``type``: an IPoIB netdev.
_ARPHRD_INFINIBAND = 32
# Shared mode's warning is given once per process (a daemon's child serves
# many calls).
_shared_warned = False


def soft_name(vf_pci: str) -> str:
    """The rxe device's name for a VF: from its PCI address, so that in shared mode (one name space for all pods) no two clash."""
    return "rxe_" + re.sub(r"[:.]", "_", vf_pci)


def _device_error(msg: str, details: str = "") -> CNIError:
    return CNIError(Code.DEVICE, msg, details)


def pool_filter(vfs: list[sysfs.VF], mode: str, sys_root: Path) -> list[sysfs.VF]:
    """Self-allocation under ``required`` takes only VFs with an RDMA device (the device plugin's isRdma)."""
    if mode != "required":
        return vfs
    return [vf for vf in vfs if rdma.vf_rdma_devices(sys_root, vf.pci)]


def listed(alloc: Allocation, sys_root: Path) -> list[str]:
    """The VF's RDMA devices in the host's sysfs, as ADD reads them once for its move and its device-info file."""
    return rdma.vf_rdma_devices(sys_root, alloc.vf_pci)


def _vf_device(alloc: Allocation, mode: str, sys_root: Path, found: list[str]) -> str | None:
    away = sorted(set(rdma.vf_verbs_devices(sys_root, alloc.vf_pci).values()) - set(found))
    if away:
        raise aside.VfUnusable(
            aside.RDMA_ELSEWHERE,
            f"VF {alloc.vf_pci}'s RDMA device {', '.join(away)} is in another network namespace",
            "another tool moved it there, or a pod still holds it; the pod would get the VF without it",
        )
    if len(found) > 1:
        raise _device_error(
            f"VF {alloc.vf_pci} has {len(found)} RDMA devices ({', '.join(found)}); which one the pod gets is ambiguous",
            'set "rdma": "off" for this network, or give the VF one RDMA device',
        )
    if not found:
        if mode == "required":
            raise _device_error(f"VF {alloc.vf_pci} has no RDMA device, and the network requires one")
        return None
    return found[0]


def _refuse_infiniband(lease: NewLease, sys_root: Path) -> None:
    netdev = lease.vf.netdev
    if netdev is None:
        return
    try:
        kind = sysfs.read_int(sysfs.pci_dir(sys_root, lease.alloc.vf_pci) / "net" / netdev / "type")
    except sysfs.SysfsError:
        return
    if kind == _ARPHRD_INFINIBAND:
        raise _device_error(
            f"VF {lease.alloc.vf_pci} ({netdev}) is an InfiniBand VF: this plugin gives RDMA to RoCE VFs only",
            'use ib-sriov-cni for InfiniBand VFs (it sets their GUIDs), or set "rdma": "off"',
        )


def _shared(name: str, mode: str) -> None:
    """Shared mode: ``required`` is refused; ``auto`` goes on, and the log says so once."""
    global _shared_warned
    if mode == "required":
        raise _device_error(
            f"the node's RDMA netns mode is shared: {name} would stay visible to every pod, "
            'and the network requires one of the pod\'s own ("rdma": "required")',
            'switch the node to exclusive mode (rdmaNetnsMode in the node config), or use "rdma": "auto"',
        )
    if not _shared_warned:
        _shared_warned = True
        logger.warning(
            "RDMA netns mode is shared: RDMA devices such as %s stay visible to every pod on this node; "
            "pods are not isolated (said once)",
            name,
        )


def move_in(lease: NewLease, mode: str, sys_root: Path, found: list[str]) -> str | None:
    """ADD, before the netdev moves: the VF's RDMA device (of those ``found``) into the pod (exclusive mode); its name, if it has one."""
    alloc = lease.alloc
    if mode == "off":
        return None
    if not alloc.dpdk:
        _refuse_infiniband(lease, sys_root)
    if mode == "soft":
        return None
    if alloc.dpdk:
        if mode == "required":
            raise _device_error(f"VF {alloc.vf_pci} is on a DPDK driver: it has no RDMA device to give the pod")
        return None
    name = _vf_device(alloc, mode, sys_root, found)
    if name is None:
        return None
    try:
        with rdma.Rdma() as host:
            if host.netns_mode() == "shared":
                _shared(name, mode)
                return name
            index = host.device(name).index
            # Recorded first: a DEL or GC after a crash mid-move looks for it.
            alloc.rdma_device, alloc.rdma_index = name, index
            lease.save()
            host.move(index, alloc.netns)
    except nlerrors.NotSupported as exc:
        alloc.rdma_device = alloc.rdma_index = None
        lease.save()
        raise _device_error(
            f"RDMA device {name} of VF {alloc.vf_pci} cannot move into the pod's network namespace: {exc}",
            'its driver cannot move it; set "rdma": "off" for this network, or switch the node to shared mode',
        ) from exc
    except nlerrors.NetlinkError as exc:
        raise _device_error(f"moving RDMA device {name} into {alloc.netns}: {exc}") from exc
    logger.info("moved RDMA device %s into %s", name, alloc.netns)
    return name


def make_soft(lease: Lease, mode: str) -> str | None:
    """ADD, after the netdev is in the pod: for ``soft``, an rxe device on it, living in the pod; its name."""
    alloc = lease.alloc
    if mode != "soft":
        return None
    if alloc.dpdk:
        raise _device_error(f"VF {alloc.vf_pci} is on a DPDK driver: Soft-RoCE needs its netdev")
    name = soft_name(alloc.vf_pci)
    alloc.rdma_device = name
    alloc.rdma_soft = True
    lease.save()
    try:
        with rdma.Rdma(alloc.netns) as pod:
            pod.add_link(name, "rxe", alloc.ifname)
    except nlerrors.NetlinkError as exc:
        # Nothing was made: the rollback has no device to look for.
        alloc.rdma_device = None
        alloc.rdma_soft = False
        lease.save()
        # EINVAL: no driver registers the rxe link type (rdma_rxe not loaded).
        if isinstance(exc, (nlerrors.NotSupported, nlerrors.InvalidArgument)):
            raise _device_error(
                f"cannot make a Soft-RoCE device on {alloc.ifname}: {exc}",
                "the node's kernel needs rdma_rxe (Linux 7.2 or later for rxe inside a pod; 7.3 in exclusive mode)",
            ) from exc
        raise _device_error(f"making Soft-RoCE device {name} on {alloc.ifname}: {exc}") from exc
    try:
        with rdma.Rdma(alloc.netns) as pod:
            elsewhere = pod.netns_mode() == "exclusive" and name not in {d.name for d in pod.devices()}
        if elsewhere:
            # Made in the host's namespace: moved where its netdev is.
            with rdma.Rdma() as host:
                host.move(host.device(name).index, alloc.netns)
    except nlerrors.NetlinkError as exc:
        raise _device_error(f"moving Soft-RoCE device {name} into {alloc.netns}: {exc}") from exc
    logger.info("made Soft-RoCE device %s on %s in %s", name, alloc.ifname, alloc.netns)
    return name


def _in(netns_path: str | None, name: str) -> bool:
    try:
        with rdma.Rdma(netns_path) as handle:
            return any(d.name == name for d in handle.devices())
    except nlerrors.NetnsNotFound:
        return False


def give_back(alloc: Allocation, sys_root: Path) -> None:
    """DEL, GC, rollback and stale reclaim, before the netdev leaves the pod; tolerates anything already gone.

    Raises CNIError when the device is neither back nor to be found.
    """
    name = alloc.rdma_device
    if name is None:
        return
    try:
        if alloc.rdma_soft:
            _remove_soft(alloc, name)
        else:
            _move_back(alloc, name, sys_root)
    except nlerrors.NetlinkError as exc:
        raise _device_error(f"RDMA device {name} of VF {alloc.vf_pci}: {exc}") from exc


def _remove_soft(alloc: Allocation, name: str) -> None:
    # An rxe device dies with its netdev's move out of the namespace, so
    # after a pod's death it is gone already; the host looks too (shared
    # mode shows it everywhere; a move back in exclusive mode too).
    for where in (alloc.netns if alloc.in_pod else None, None):
        try:
            with rdma.Rdma(where) as handle:
                handle.delete_link(name)
            logger.info("removed Soft-RoCE device %s", name)
            return
        except (nlerrors.LinkNotFound, nlerrors.NetnsNotFound, nlerrors.NotSupported):
            # NotSupported: a kernel without RDMA netlink has no such device.
            continue


def _move_back(alloc: Allocation, name: str, sys_root: Path) -> None:
    """The device home under ``name``, from the pod or after the kernel returned it; gone is fine, with a warning."""
    index = alloc.rdma_index
    if index is None:
        # Shared mode: nothing was moved.
        return
    pod_alive = netns.netns_inode(alloc.netns) == alloc.netns_inode
    if pod_alive:
        try:
            with rdma.Rdma(alloc.netns) as pod:
                inside = pod.find(index)
        except nlerrors.NetnsNotFound:
            inside, pod_alive = None, False
        if inside is not None:
            _move_home(alloc, inside)
    # From a dead namespace the kernel hands its devices back from its
    # cleanup work, later; renamed ibdevN when the name is taken here.
    deadline = time.monotonic() + RETURN_WAIT
    while True:
        with rdma.Rdma() as host:
            home = host.find(index)
            if home is not None:
                _restore_name(host, home, name)
                return
        gone = _gone(alloc, sys_root)
        if gone is not None or pod_alive:
            # In neither namespace while the pod lives: it went with its VF
            # or driver (a firmware reset, mlx5_ib unloaded), or the pod put
            # it in a third namespace, which only its end brings back.
            logger.warning(
                "RDMA device %s of VF %s is not in %s nor in the host: %s; nothing to give back",
                name,
                alloc.vf_pci,
                alloc.netns,
                gone or "it is in another namespace",
            )
            return
        if time.monotonic() > deadline:
            raise CNIError(
                Code.TRY_AGAIN,
                f"RDMA device {name} of VF {alloc.vf_pci} has not come back to the host within {RETURN_WAIT:g} s",
            )
        time.sleep(0.1)


def _move_home(alloc: Allocation, inside: rdma.RdmaDevice) -> None:
    """Move the pod's device (``inside``, as the pod names it) to the host, renaming it in the pod first if its name is taken there."""
    host_path = netns.own_netns_path()
    try:
        rdma.move_out(alloc.netns, inside.index, host_path)
    except nlerrors.LinkExists:
        # The pod renamed it to a name the host has, or (kernels with
        # per-namespace RDMA names) a host device took its name meanwhile.
        # A name of its index is free: RDMA device names are unique here.
        with rdma.Rdma(alloc.netns) as pod:
            pod.rename(inside.index, _parking_name(inside.index))
        rdma.move_out(alloc.netns, inside.index, host_path)
    logger.info("moved RDMA device %s back from %s", inside.name, alloc.netns)


def _parking_name(index: int) -> str:
    return f"sriovcni_rdma{index}"


def _restore_name(host: rdma.Rdma, home: rdma.RdmaDevice, name: str) -> None:
    """Give the device home the name it had before ADD, when another name is what it came back with."""
    if home.name == name:
        return
    try:
        host.rename(home.index, name)
    except nlerrors.LinkExists:
        logger.warning("RDMA device %s came back as %s: %s is taken on the host now", name, home.name, name)
        return
    logger.info("RDMA device %s came back as %s; renamed %s again", name, home.name, name)


def _gone(alloc: Allocation, sys_root: Path) -> str | None:
    """Why the VF has no RDMA device any more, or None when it may still have one somewhere."""
    if not sysfs.pci_dir(sys_root, alloc.vf_pci).exists():
        return "the VF is gone"
    if sysfs.driver(sys_root, alloc.vf_pci) is None:
        return "the VF has no driver"
    # ib_uverbs lists the function's devices in every namespace: with it
    # loaded, none listed means none exists.
    if (sys_root / "class" / "infiniband_verbs").is_dir() and not rdma.vf_verbs_devices(sys_root, alloc.vf_pci):
        return "the VF has no RDMA device any more"
    return None


def check(alloc: Allocation) -> list[str]:
    """CHECK: where the recorded device should be and is not."""
    name = alloc.rdma_device
    if name is None:
        return []
    try:
        if alloc.rdma_index is not None:
            with rdma.Rdma(alloc.netns) as pod:
                if pod.find(alloc.rdma_index) is not None:
                    return []
        elif _in(alloc.netns, name):
            return []
    except nlerrors.NetlinkError as exc:
        return [f"RDMA device {name}: {exc}"]
    return [f"RDMA device {name} is not in {alloc.netns}"]


def gid_index(alloc: Allocation, device: str, addresses: Sequence[IPAddress], sys_root: Path) -> int | None:
    """The RoCE v2 GID index of the pod's address on ``device``, read in the pod; None (and why, in the log) if none.

    IPv4 first: NCCL picks IPv4 GIDs unless told otherwise.  No index is
    not an error: the pod has its device; only the hint is missing.  That
    happens without an address (no IPAM, or one that gave none), on an
    InfiniBand device (its GIDs are not IP addresses), or when the entry
    does not come within :data:`GID_WAIT`.
    """
    if alloc.dpdk:
        return None
    ordered = sorted((a for a in addresses if not a.is_link_local), key=lambda a: a.version)
    if not ordered:
        logger.info("no RoCE v2 GID index for %s: the pod's %s has no IP address", device, alloc.ifname)
        return None
    try:
        found = rdma.roce_v2_gid_index(alloc.netns, sys_root, device, alloc.ifname, ordered, GID_WAIT)
    except netns.NamespaceError as exc:
        logger.warning("no RoCE v2 GID index for %s: %s", device, exc)
        return None
    if isinstance(found, str):
        logger.warning("no RoCE v2 GID index for the pod: %s", found)
        return None
    logger.info("RoCE v2 GID index of the pod's address on %s: %d", device, found)
    return found
