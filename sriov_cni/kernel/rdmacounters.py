"""An RDMA device's port counters, from sysfs: the host's, or a pod's namespace's own.

Each port of ``<sys>/class/infiniband/<dev>/ports/<n>/`` has ``counters/``
(the InfiniBand PMA counters; mlx5 fills them for RoCE as well) and
``hw_counters/`` (the driver's own: rxe's ``sent_pkts``, ``rcvd_pkts``...).
``port_xmit_data`` and ``port_rcv_data`` count 4-byte words, as the
InfiniBand spec has them; mlx5 keeps that unit on RoCE too.

In exclusive mode a device moved into a pod's namespace is listed only in a
sysfs mounted from inside that namespace: :func:`read_in_netns` reads it in
a forked child that enters the namespace and mounts its own sysfs there,
in a private mount namespace (:func:`~sriov_cni.kernel.netns.run_in_netns`),
so the pod's processes and mounts are left as they are.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sriov_cni.kernel import netns

# The files of a port's counter directories, by directory.
GROUPS = ("counters", "hw_counters")


@dataclass(frozen=True)
class PortCounter:
    port: int
    group: str  # one of GROUPS
    name: str
    value: int


def read(sys_root: Path, device: str) -> list[PortCounter]:
    """Every counter of every port of ``device`` in the sysfs at ``sys_root``; [] for a device it does not list.

    A counter the driver cannot read (EINVAL, EOPNOTSUPP on read, as some
    mlx5 ones on a VF) or that is no number is left out.
    """
    ports = sys_root / "class" / "infiniband" / device / "ports"
    out: list[PortCounter] = []
    try:
        numbers = sorted(int(p) for p in os.listdir(ports) if p.isdigit())
    except OSError:
        return out
    for port in numbers:
        for group in GROUPS:
            directory = ports / str(port) / group
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in names:
                try:
                    text = (directory / name).read_text().strip()
                    out.append(PortCounter(port, group, name, int(text)))
                except (OSError, ValueError):
                    continue
    return out


def read_in_netns(path: str, sys_root: Path, device: str) -> list[PortCounter]:
    """:func:`read` inside the network namespace ``path``, from a sysfs mounted there at ``sys_root``.

    Raises :class:`~sriov_cni.kernel.netns.NamespaceError` when the
    namespace cannot be entered or sysfs mounted.
    """
    with tempfile.TemporaryFile() as found:

        def inside() -> None:
            rows = [[c.port, c.group, c.name, c.value] for c in read(sys_root, device)]
            found.write(json.dumps(rows).encode())
            found.flush()

        netns.run_in_netns(path, inside, own_sysfs=sys_root)
        found.seek(0)
        return [PortCounter(int(p), str(g), str(n), int(v)) for p, g, n, v in json.loads(found.read() or b"[]")]
