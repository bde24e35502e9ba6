"""The pod's device-info file: ADD writes it, DEL removes what ADD created (the format: :mod:`sriov_cni.deviceinfo`).

ADD writes the file once the VF is in the pod with its addresses (only
the wait for its carrier comes after): a failure before it has nothing to
undo here, and Multus reads the file only after a successful ADD.  A file that was there before ADD (the device plugin's or DRA
driver's, copied by Multus) is kept with the VF's facts added, and left
for Multus to remove on DEL, as the spec has it; a file this plugin
created is recorded before it is written, and DEL removes it, so a caller
that is not Multus finds the node as it was.  Multus' own removal after
DEL tolerates the file being gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sriov_cni import deviceinfo
from sriov_cni.plugin.lease import Lease
from sriov_cni.vfstore import Allocation


def publish(path: str, lease: Lease, ours: dict[str, Any], gid_index: Callable[[str], int | None]) -> None:
    """The VF's device information (``ours``) written to ``path`` (the caller's CNIDeviceInfoFile), kept with what is there.

    With an RDMA device (the file's or ours), its RoCE v2 GID index of the
    pod's address too, as ``rdma-gid-index``: ``gid_index(device)``, None
    when there is none.
    """
    alloc = lease.alloc
    found = deviceinfo.read(path)
    info = deviceinfo.merged(path, found, ours)
    # A file of another type (vDPA) is left as its writer made it.
    pci = info.get(deviceinfo.TYPE) if info["type"] == deviceinfo.TYPE else None
    device = pci.get("rdma-device") if isinstance(pci, dict) else None
    if isinstance(pci, dict) and isinstance(device, str):
        index = gid_index(device)
        if index is not None:
            pci[deviceinfo.GID_INDEX_KEY] = index
    if found is None:
        alloc.device_info_file = path
        lease.save()
    if info != found:
        deviceinfo.write(path, info)


def withdraw(alloc: Allocation) -> None:
    """The file the attachment's ADD created, removed; raises CNIError."""
    if alloc.device_info_file:
        deviceinfo.remove(alloc.device_info_file)
