"""Device information files (the Network Plumbing WG's Device Information Spec 1.1.0).

A pod learns which device it got from such a file: a device plugin (or a
DRA driver) writes one per device, Multus copies it to the path it passes
as ``runtimeConfig.CNIDeviceInfoFile`` and, after ADD, puts what the file
says into the pod's ``network-status`` annotation.  The plugin reads that
file when it is there, keeps what it says and fills in what sysfs knows of
the VF: its PCI address, its PF's and its RDMA device.  The ``sriov`` plugin
writes files; ``sriov-cni status`` shows the same facts.

The layout is the spec's, for a PCI device::

    {"type": "pci", "version": "1.1.0",
     "pci": {"pci-address": "0000:3b:02.1", "pf-pci-address": "0000:3b:00.0", "rdma-device": "mlx5_3"}}
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from sriov_cni import safepath
from sriov_cni.cni import CNIError, Code
from sriov_cni.kernel import rdma

VERSION = "1.1.0"
TYPE = "pci"
# Not a field of the spec: the RoCE v2 GID index of the pod's address on its
# ``rdma-device`` (what NCCL_IB_GID_INDEX and perftest's -x take), an integer
# beside the device it qualifies.  The spec's fields keep their meaning, and
# its readers tolerate the extra key: Multus and the DRA drivers decode the
# file into Go structs, which skip unknown keys (so Multus' network-status
# annotation, rebuilt from those structs, does not carry it); readers of the
# file itself, a DRA driver publishing it in its claim's status, get it.
GID_INDEX_KEY = "rdma-gid-index"
# Not a field of the spec either: the device's verbs character device as it
# is after ADD moved the device.  A move removes and re-adds the device's
# uverbs entry, which takes the lowest free number, so the one a device
# plugin or DRA driver resolved before ADD may since name another device.
UVERBS_KEY = "rdma-uverbs-device"
# Far above a real file (a few hundred bytes); a larger one is not a device-info file.
MAX_FILE = 64 * 1024
# Multus and the workloads that read these files may not run as root.
FILE_MODE = 0o644
DIR_MODE = 0o755


def facts(
    sys_root: Path, vf_pci: str, pf_pci: str, held: str | None = None, listed: list[str] | None = None
) -> dict[str, Any]:
    """What the pod is told of its VF, in the spec's layout.

    ``held`` is the RDMA device its attachment holds (moved into the pod,
    or a Soft-RoCE one made there, which has no PCI parent); otherwise the
    one sysfs lists under the VF (``listed``, when the caller has read that
    already).  A VF listing two is left without ``rdma-device``: which one
    the pod would use cannot be told.
    """
    pci = {"pci-address": vf_pci, "pf-pci-address": pf_pci}
    if held is None and listed is None:
        listed = rdma.vf_rdma_devices(sys_root, vf_pci)
    device = held or (listed[0] if listed is not None and len(listed) == 1 else None)
    if device is not None:
        pci["rdma-device"] = device
        uverbs = rdma.uverbs_device(sys_root, vf_pci, device)
        if uverbs is not None:
            pci[UVERBS_KEY] = f"/dev/infiniband/{uverbs}"
    return {"type": TYPE, "version": VERSION, "pci": pci}


def _bad(path: str, why: str) -> CNIError:
    return CNIError(
        Code.INVALID_CONFIG,
        f"device-info file {path} {why}",
        "it is the runtimeConfig.CNIDeviceInfoFile the caller passed, written by a device plugin or DRA driver",
    )


def read(path: str) -> dict[str, Any] | None:
    """The device information in ``path``; None when there is no file.

    A file that is not a JSON object with a string ``type`` is refused: the
    pod would be told something nobody meant.
    """
    try:
        data = safepath.read_file(path, MAX_FILE)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _bad(path, f"cannot be read: {exc.strerror or exc}") from exc
    try:
        info = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _bad(path, f"is not JSON: {exc}") from exc
    if not isinstance(info, dict) or not isinstance(info.get("type"), str):
        raise _bad(path, 'is not a device information object (no string "type")')
    return info


def merged(path: str, found: dict[str, Any] | None, ours: dict[str, Any]) -> dict[str, Any]:
    """``found`` (the file's content) with what ``ours`` adds; ``ours`` alone when there was no file.

    What the file says is kept: its writer knows more of the device (a
    representor, a vhost-net path) than sysfs tells.  A file of another
    type (a vDPA device on the VF) is kept as it is.  One that names
    another PCI device than the VF this attachment holds is refused.
    """
    if found is None:
        return ours
    if found["type"] != TYPE:
        return found
    pci = found.get(TYPE)
    if pci is None:
        pci = {}
    if not isinstance(pci, dict):
        raise _bad(path, f'has a "{TYPE}" that is not an object')
    named = pci.get("pci-address")
    if named is not None and (not isinstance(named, str) or named.lower() != ours[TYPE]["pci-address"]):
        raise _bad(path, f"names PCI device {named!r}, not this attachment's VF {ours[TYPE]['pci-address']}")
    out = dict(found)
    out.setdefault("version", VERSION)
    out[TYPE] = {**ours[TYPE], **pci}
    return out


def write(path: str, info: dict[str, Any]) -> None:
    """Make ``info`` the content of ``path`` at once (a reader sees the old file or the new), creating its directory.

    The spec's directory (``/var/run/k8s.cni.cncf.io/devinfo/cni``) need not
    exist yet; the caller may not have written anything there.
    """
    try:
        # Symlinks on the way are followed, unlike in dataDir: the spec's
        # path goes through /var/run, a symlink to /run on most nodes.  The
        # file itself is replaced by a rename, never written through a link.
        os.makedirs(os.path.dirname(path), DIR_MODE, exist_ok=True)
        safepath.replace_file(path, json.dumps(info).encode(), FILE_MODE)
    except OSError as exc:
        reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise CNIError(Code.IO_FAILURE, f"cannot write device-info file {path}: {reason}") from exc


def remove(path: str) -> None:
    """Remove ``path``; a file already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CNIError(Code.IO_FAILURE, f"cannot remove device-info file {path}: {exc.strerror or exc}") from exc
