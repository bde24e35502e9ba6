"""The per-node record of which VF belongs to which container.

One JSON file per allocated VF, named after its PCI address, under
``<dataDir>/vfs/``; and one per VF set aside (a VF that did not come up
in a pod, see :mod:`sriov_cni.plugin.aside`) under ``<dataDir>/aside/``.

A VF's record changes only under the VF's claim, a flock on
``<dataDir>/claims/<PCI>.lock``: an ADD takes it before it records the VF
and keeps it until it has returned or rolled back; DEL and GC take it
before they give the VF back and remove the record.  It is the store's only
lock.  There is no node-wide one, so calls for different VFs never wait for
each other, and an ADD passes over a VF another call has claimed rather
than wait for it.

What a caller read before it had the claim may be out of date by the time
it has it: the holder before it may have recorded the VF, replaced its
record or removed it.  So a caller checks the record again under the claim
before acting on it: an ADD, that the VF still has no record (or still the
stale one it chose to reclaim); a DEL or GC, that it still belongs to the
attachment being deleted, taking from it what to put back.  Without the
claim, a DEL of a pod whose netns is gone and an ADD reclaiming that same
stale record would both restore the VF, and the DEL could undo the settings
the ADD just made for its own pod.  The kernel drops a claim when its
holder dies, so a killed call never leaves a VF claimed.

Every write goes to a temporary file that is fsynced and renamed over the
old one, so a crash at any point leaves each record either old or new,
never torn (one fsync per write; see :meth:`FileStore.put`).  Files are 0600, directories 0700 and writable by nobody
else, and no symlink is followed (see :mod:`sriov_cni.safepath`): the store runs as
root and must not be steerable into overwriting other files.

:class:`FileStore` implements :class:`Store`; the tests' in-memory store
(tests/support/fakes.py) implements it too, and one conformance suite
(tests/test_vf_store.py) runs against both, so the fake behaves as the
plugin expects of the real store.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import stat
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sriov_cni import safepath
from sriov_cni.cni import CNIError, Code, io_error
from sriov_cni.kernel.vfsettings import PfSettings, Rate, Vlan

DEFAULT_DATA_DIR = "/var/lib/cni/sriov"
_Record = TypeVar("_Record")


@dataclass
class OriginalState:
    """How a VF was before we touched it, so DEL can put it back exactly."""

    pf: PfSettings
    # Netdev side; empty/None for a VF on a DPDK driver.
    netdev: str = ""
    mtu: int | None = None
    mac: str = ""
    promisc: bool | None = None
    altnames: list[str] = field(default_factory=list)
    alias: str = ""
    # IFF_* flags besides promisc by name (allmulti, multicast, noarp); link
    # settings by name (txqlen, group, GSO/GRO limits), those the kernel
    # reports; the id of the XDP program attached (0: none); the ethtool
    # settings by group (sriov_cni.kernel.ethtool.read).
    flags: dict[str, bool] = field(default_factory=dict)
    settings: dict[str, int] = field(default_factory=dict)
    xdp: int = 0
    ethtool: dict[str, Any] = field(default_factory=dict)


@dataclass
class Allocation:
    vf_pci: str
    pf_pci: str
    pf_netdev: str
    vf_index: int
    network: str
    container_id: str
    ifname: str
    netns: str
    netns_inode: int | None
    dpdk: bool = False
    # The pod, as CNI_ARGS names it (K8S_POD_NAMESPACE, K8S_POD_NAME,
    # K8S_POD_UID); empty when the runtime gives none (podman, ctr).
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    created: float = field(default_factory=time.time)
    # The kernel's boot_id when the record was made: a pod of an earlier
    # boot is gone, whatever its netns path names now.
    boot_id: str = ""
    # What the network's IPAM DEL needs to release the attachment's address
    # when no DEL comes (the pod's namespace died): the network config as
    # the IPAM plugin reads it, None for a network without IPAM; and the
    # call's CNI_ARGS and CNI_PATH.
    ipam_config: dict[str, Any] | None = None
    cni_args: str = ""
    cni_path: str = ""
    # Why the daemon is giving the VF back ("netns gone", "earlier boot"),
    # recorded before it starts; empty otherwise.
    giving_back: str = ""
    # None until the snapshot is recorded, which happens before any change.
    original: OriginalState | None = None
    # PF-side settings this allocation applies (restored in reverse order).
    applied: PfSettings = field(default_factory=PfSettings)
    # Set before the netdev is moved into the pod: only then may a restore
    # take an interface out of the pod's namespace.
    in_pod: bool = False
    # The device-info file this attachment's ADD created, recorded before it
    # is written; DEL removes it (one the caller or a device plugin wrote
    # is theirs to remove).
    device_info_file: str = ""
    # What a give-back could not put back as recorded, one entry each: the
    # record is kept so no pod gets the VF before a give-back succeeds.
    unrestored: list[str] = field(default_factory=list)
    # The VF's RDMA device moved into the pod, or the Soft-RoCE device made
    # there (rdma_soft); recorded before the change (see plugin/rdma.py).
    rdma_device: str | None = None
    # Its index (moved devices only), which no move or rename changes: DEL
    # finds it by that, and gives it back under ``rdma_device``.
    rdma_index: int | None = None
    rdma_soft: bool = False
    # RLIMIT_MEMLOCK in bytes for the pod's containers (the network's
    # rdmaMemlock), which the daemon's NRI plugin sets with the device's
    # character devices; None: unlimited.
    rdma_memlock: int | None = None

    def owned_by(self, container_id: str, ifname: str, network: str | None = None) -> bool:
        return (
            self.container_id == container_id and self.ifname == ifname and (network is None or self.network == network)
        )

    def to_json(self) -> str:
        # Field by field rather than dataclasses.asdict, which deep-copies
        # the record first; and on one line, which json writes with its C
        # encoder (an indented record takes the pure-Python one).
        raw = {name: getattr(self, name) for name in _ALLOCATION_FIELDS}
        raw["applied"] = _settings_to_json(self.applied)
        if self.original is not None:
            netdev_side = {name: getattr(self.original, name) for name in _NETDEV_SIDE}
            raw["original"] = {"pf": _settings_to_json(self.original.pf), **netdev_side}
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> Allocation:
        raw = json.loads(text)
        original = raw.pop("original", None)
        applied = raw.pop("applied", {})
        alloc = cls(**{k: v for k, v in raw.items() if k in _ALLOCATION_FIELDS})
        alloc.applied = _settings_from_json(applied)
        if original is not None:
            alloc.original = OriginalState(
                pf=_settings_from_json(original["pf"]),
                **{k: v for k, v in original.items() if k in _NETDEV_SIDE},
            )
        return alloc


@dataclass
class SetAside:
    """A VF that did not come up in a pod: why, when, how often, and until when ADD passes over it."""

    vf_pci: str
    # A short kind ("no carrier", "link disabled") and the failure as ADD reported it.
    reason: str
    detail: str
    # The first failure since the VF last worked, the latest, and how many.
    since: float
    last: float
    failures: int
    retry_after: float

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> SetAside:
        raw = json.loads(text)
        return cls(**{f.name: raw[f.name] for f in fields(cls)})


_ALLOCATION_FIELDS = tuple(f.name for f in fields(Allocation))
# OriginalState's fields besides the PF-side snapshot.
_NETDEV_SIDE = tuple(f.name for f in fields(OriginalState) if f.name != "pf")


def _settings_to_json(pf: PfSettings) -> dict[str, Any]:
    """PF-side settings in a record, the snapshot's as the applied ones: only those in the value."""
    return dict(pf.items())


def _settings_from_json(raw: dict[str, Any]) -> PfSettings:
    return PfSettings(
        vlan=Vlan(*raw["vlan"]) if "vlan" in raw else None,
        mac=raw.get("mac"),
        rate=Rate(*raw["rate"]) if "rate" in raw else None,
        spoofchk=raw.get("spoofchk"),
        trust=raw.get("trust"),
        link_state=raw.get("link_state"),
    )


class Claim:
    """The exclusive right to change one VF, until dropped (also as a context manager)."""

    def __init__(self, drop: Callable[[], None]) -> None:
        self._drop: Callable[[], None] | None = drop

    def drop(self) -> None:
        if self._drop is not None:
            self._drop()
            self._drop = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()


class Store(Protocol):
    def claim(self, vf_pci: str, wait: float = 0.0) -> Claim | None:
        """The VF's claim, or None when another holder keeps it longer than ``wait`` seconds."""
        ...

    def all(self) -> list[Allocation]: ...

    def ids(self) -> AbstractSet[str]:
        """PCI addresses of the VFs with a record, without reading any."""
        ...

    def has(self, vf_pci: str) -> bool:
        """Whether the VF has a record, without reading it: ``vf_pci in ids()`` for one VF."""
        ...

    def get(self, vf_pci: str) -> Allocation | None: ...

    def put(self, alloc: Allocation) -> None:
        """Record ``alloc``, replacing the VF's record; under the VF's claim, as every change."""
        ...

    def remove(self, vf_pci: str) -> None: ...

    def set_aside(self, record: SetAside) -> None:
        """Record the VF as set aside, replacing an earlier record; under the VF's claim."""
        ...

    def aside(self) -> dict[str, SetAside]:
        """The VFs set aside, by PCI address."""
        ...

    def unset_aside(self, vf_pci: str) -> None:
        """The VF is no longer set aside; under the VF's claim."""
        ...


# Far above a real record (about 1 KiB); a larger file is not ours.
MAX_RECORD = 64 * 1024
# A claim another call holds is tried again after this, doubling up to
# _CLAIM_RETRY_MAX: the holder a DEL or GC waits for may be a rollback that
# ends within milliseconds or a whole ADD, and a waiter should notice
# either end soon without spinning.
_CLAIM_RETRY = 0.001
_CLAIM_RETRY_MAX = 0.01


def _flock(path: str, wait: float) -> int | None:
    """An open descriptor of ``path`` holding its exclusive flock, or None after ``wait`` seconds.

    Closing the descriptor releases the lock, and so does the holder's
    death.  By hand rather than with filelock: making a filelock lock
    inspects its own signature, which in an ADD cost more than the
    locking itself.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + wait
    retry = _CLAIM_RETRY
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                os.close(fd)
                return None
            time.sleep(min(retry, left))
            retry = min(2 * retry, _CLAIM_RETRY_MAX)
        except OSError:
            os.close(fd)
            raise


class FileStore:
    def __init__(self, data_dir: str | Path = DEFAULT_DATA_DIR) -> None:
        self.root = Path(data_dir)
        self.vfs_dir = self.root / "vfs"
        self.claims_dir = self.root / "claims"
        self.aside_dir = self.root / "aside"
        self._ready = False

    def _prepare(self) -> None:
        if not self._ready:
            safepath.state_dir(str(self.root))
            safepath.state_dir(str(self.vfs_dir))
            safepath.state_dir(str(self.claims_dir))
            self._ready = True

    def claim(self, vf_pci: str, wait: float = 0.0) -> Claim | None:
        self._prepare()
        path = self.claims_dir / f"{vf_pci}.lock"
        try:
            fd = _flock(str(path), wait)
        except OSError as exc:
            raise io_error(exc, f"cannot lock {path}") from exc
        return None if fd is None else Claim(functools.partial(os.close, fd))

    def _path(self, vf_pci: str) -> Path:
        return self.vfs_dir / f"{vf_pci}.json"

    def _read(self, path: Path) -> Allocation | None:
        data = self._read_bytes(path)
        if data is None:
            return None
        return self._decode(path, data, Allocation.from_json)

    def _read_bytes(self, path: Path) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise io_error(exc, f"cannot read {path}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CNIError(Code.IO_FAILURE, f"state file {path} is not a regular file", "remove it")
            data = os.read(fd, MAX_RECORD + 1)
        except OSError as exc:
            raise io_error(exc, f"cannot read {path}") from exc
        finally:
            os.close(fd)
        return data

    @staticmethod
    def _decode(path: Path, data: bytes, parse: Callable[[str], _Record]) -> _Record:
        try:
            if len(data) > MAX_RECORD:
                raise ValueError(f"larger than {MAX_RECORD} bytes")
            return parse(data.decode())
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            # Writes are atomic, so this is outside tampering.  Refusing is
            # safer than guessing: a guess could hand the VF out twice.
            raise CNIError(
                Code.IO_FAILURE,
                f"state file {path} is unreadable",
                f"{exc}; check which container uses this VF, then remove the file",
            ) from exc

    def _record_names(self) -> list[str]:
        self._prepare()
        return sorted(name for name in os.listdir(self.vfs_dir) if name.endswith(".json"))

    def all(self) -> list[Allocation]:
        out = []
        for name in self._record_names():
            alloc = self._read(self.vfs_dir / name)
            if alloc is not None:
                out.append(alloc)
        return out

    def scan(self) -> tuple[list[Allocation], dict[str, str]]:
        """:meth:`all`, but an unreadable record is reported (why, by its VF's PCI address) instead of raised."""
        out: list[Allocation] = []
        bad: dict[str, str] = {}
        for name in self._record_names():
            try:
                alloc = self._read(self.vfs_dir / name)
            except CNIError as exc:
                bad[name[: -len(".json")]] = f"{exc.msg}: {exc.details}" if exc.details else exc.msg
                continue
            if alloc is not None:
                out.append(alloc)
        return out, bad

    def ids(self) -> set[str]:
        return {name[: -len(".json")] for name in self._record_names()}

    def has(self, vf_pci: str) -> bool:
        self._prepare()
        path = self._path(vf_pci)
        # Whatever sits at the record's name counts, as in ids(): a file
        # that is not a readable record makes the VF taken, not free.
        try:
            os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise io_error(exc, f"cannot read {path}") from exc
        return True

    def get(self, vf_pci: str) -> Allocation | None:
        self._prepare()
        return self._read(self._path(vf_pci))

    def put(self, alloc: Allocation) -> None:
        self._prepare()
        path = self._path(alloc.vf_pci)
        try:
            # The record's data is synced before the rename, so no crash can
            # leave it torn or empty.  The directory is not synced: a rename
            # lost with the page cache (power loss, kernel crash) leaves the
            # previous record whole, and the VFs it describes do not survive
            # a reboot either (the driver recreates them unset, the pods'
            # namespaces are gone).  remove() has never synced it.
            safepath.replace_file(path, alloc.to_json().encode(), 0o600)
        except OSError as exc:
            raise io_error(exc, f"cannot record allocation in {path}") from exc

    def remove(self, vf_pci: str) -> None:
        self._prepare()
        self._unlink(self._path(vf_pci))

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise io_error(exc, f"cannot remove {path}") from exc

    def _prepare_aside(self) -> bool:
        """Whether the set-aside directory exists, checked as the others when it does."""
        self._prepare()
        if not os.path.lexists(self.aside_dir):
            return False
        safepath.state_dir(str(self.aside_dir))
        return True

    def set_aside(self, record: SetAside) -> None:
        self._prepare()
        # Made on first use: every CNI call opens the store, few set a VF aside.
        safepath.state_dir(str(self.aside_dir))
        path = self.aside_dir / f"{record.vf_pci}.json"
        try:
            safepath.replace_file(path, record.to_json().encode(), 0o600)
        except OSError as exc:
            raise io_error(exc, f"cannot record set-aside VF in {path}") from exc

    def aside(self) -> dict[str, SetAside]:
        if not self._prepare_aside():
            return {}
        out = {}
        # Usually empty: one directory read per ADD.
        for name in sorted(os.listdir(self.aside_dir)):
            path = self.aside_dir / name
            data = self._read_bytes(path) if name.endswith(".json") else None
            if data is not None:
                record = self._decode(path, data, SetAside.from_json)
                out[record.vf_pci] = record
        return out

    def unset_aside(self, vf_pci: str) -> None:
        if self._prepare_aside():
            self._unlink(self.aside_dir / f"{vf_pci}.json")


def read_allocations(data_dir: Path) -> list[Allocation]:
    """The allocations recorded under ``data_dir``; none when the plugin never ran there.

    For the node command, which reads the store without claiming or creating
    it: FileStore creates its directories on first use, and reading the
    node must not change it.
    """
    if not (data_dir / "vfs").is_dir():
        return []
    return FileStore(data_dir).all()


def scan_allocations(data_dir: Path) -> tuple[list[Allocation], dict[str, str]]:
    """:func:`read_allocations`, going on past unreadable records, which it names: for ``status``, which must show the rest."""
    if not (data_dir / "vfs").is_dir():
        return [], {}
    return FileStore(data_dir).scan()


def read_set_aside(data_dir: Path) -> dict[str, SetAside]:
    """The VFs set aside under ``data_dir``, by PCI address, for the node command as :func:`read_allocations`."""
    if not (data_dir / "aside").is_dir():
        return {}
    return FileStore(data_dir).aside()
