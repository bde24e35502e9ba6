"""What a container of a pod with an RDMA attachment needs to use it: the character devices and the memlock limit.

A pod that got a VF's RDMA device (or a Soft-RoCE device made there) can
use it only through the device's ``/dev/infiniband/uverbsN`` and, for
librdmacm, ``/dev/infiniband/rdma_cm``; a container has neither unless
someone adds them, and registering buffers pins memory against
RLIMIT_MEMLOCK (8 MiB by default for a non-root user).  The records the
plugin's ADD wrote say which pod holds which device and the limit its
network asks for (``rdmaMemlock``); the daemon's NRI plugin
(:mod:`nri`) adds exactly these to each of that pod's containers.

uverbsN is looked up now, not at ADD: the number can change when the
device moves between namespaces.  umad and issm are left out (management
datagrams, the subnet manager's, not a workload's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sriov_cni.daemon.nriwire import Device
from sriov_cni.kernel import chardev, rdma
from sriov_cni.vfstore import Allocation, scan_allocations

logger = logging.getLogger(__name__)

DEVICE_DIR = "/dev/infiniband"


@dataclass(frozen=True)
class Access:
    """The devices to add to a container, and its RLIMIT_MEMLOCK in bytes (None: unlimited)."""

    devices: tuple[Device, ...]
    memlock: int | None


def attachments(pod_id: str, data_dir: Path) -> list[Allocation]:
    """The pod's attachments with an RDMA device: records whose container is the pod's sandbox.

    A damaged record (another VF's, as a rule) is logged and passed over:
    it must not keep this pod's containers from their devices.
    """
    records, unreadable = scan_allocations(data_dir)
    for pci, why in unreadable.items():
        logger.warning("passing over the record of VF %s: %s", pci, why)
    return [a for a in records if a.container_id == pod_id and a.rdma_device is not None]


def for_pod(pod_id: str, data_dir: Path, sys_root: Path) -> Access | None:
    """What the containers of pod sandbox ``pod_id`` get; None for a pod without an RDMA attachment.

    Several attachments: each one's device, and the highest limit of
    their networks.  An attachment whose uverbs device cannot be found
    (ib_uverbs not loaded, the device gone) adds none and is logged; the
    others still apply.
    """
    found = attachments(pod_id, data_dir)
    if not found:
        return None
    devices: list[Device] = []
    for alloc in found:
        assert alloc.rdma_device is not None
        uverbs = rdma.uverbs_device(sys_root, alloc.vf_pci, alloc.rdma_device)
        numbers = None if uverbs is None else chardev.numbers(sys_root, "infiniband_verbs", uverbs)
        if uverbs is None or numbers is None:
            logger.warning("no uverbs device found for RDMA device %s of VF %s", alloc.rdma_device, alloc.vf_pci)
            continue
        devices.append(Device(f"{DEVICE_DIR}/{uverbs}", *numbers))
    # Two attachments on one device (shared mode) add it once.
    devices = sorted(set(devices), key=lambda d: d.path)
    # Absent while rdma_ucm is not loaded: librdmacm then fails in the pod
    # as on the node.
    if (cm := chardev.numbers(sys_root, "misc", "rdma_cm")) is not None:
        devices.append(Device(f"{DEVICE_DIR}/rdma_cm", *cm))
    limits = [a.rdma_memlock for a in found]
    memlock = None if None in limits else max(limit for limit in limits if limit is not None)
    return Access(tuple(devices), memlock)
