"""The tests' in-memory stand-ins, each for one interface of the package.

- :class:`FakeVfControl` is :class:`sriov_cni.kernel.vfsettings.VfControl`
  (the PF side of SR-IOV, which needs a real NIC); :class:`SharedFakeVfControl`
  keeps one in a file, so forked calls share it.
- :class:`MemoryVfStore` is :class:`sriov_cni.vfstore.Store`.
- :class:`MemoryReservationStore` is :class:`sriov_cni.ipam.store.ReservationStore`.
- :class:`FakeLinks` is :class:`sriov_cni.node.setup.Links`, changing the
  fake sysfs tree (tests/support/nodetree.py) as the kernel would.
- :class:`FakeHost` is :class:`sriov_cni.plugin.allocate.Host`, from the tree.

``_conforms`` has mypy hold each to its interface; tests/test_vf_store.py
runs one suite against MemoryVfStore and FileStore, tests/ipam/test_store.py
one against MemoryReservationStore and DiskStore, tests/test_fakes.py
FakeHost's cases against the kernel's namespace, and
tests/vm/test_vfcontrol_igb.py FakeVfControl's against igb.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sriov_cni.kernel import netlink, sysfs, vfsettings
from sriov_cni.kernel.vfsettings import PfSettings
from sriov_cni.vfstore import Allocation, Claim, SetAside
from tests.support.nodetree import Tree

if TYPE_CHECKING:
    # Only for _conforms: the benchmarks' daemon (hostnode.py) imports this
    # module, and must not load the node command's modules or pyroute2 for it.
    from sriov_cni.cni import IPAddress
    from sriov_cni.ipam.store import Owner, ReservationStore
    from sriov_cni.kernel.vfsettings import VfControl, VfStatsReader
    from sriov_cni.node.setup import Links
    from sriov_cni.plugin.allocate import Host
    from sriov_cni.vfstore import FileStore, Store

ZERO_MAC = "00:00:00:00:00:00"


# --- the PF side ----------------------------------------------------------------


class FileVfStats:
    """:class:`~sriov_cni.kernel.vfsettings.VfStatsReader` from a JSON file: ``{pf: {vf index: {field: n}}}``.

    A file, so a test changes the counters a daemon's exporter (a process
    forked from the fixture's) reads.  A PF the file does not name has
    every VF at zero (as a driver without ``ndo_get_vf_stats``); a PF
    named with ``null`` cannot be read.  Counts the requests per PF.
    """

    def __init__(self, path: Path, requests: Path | None = None) -> None:
        self.path = path
        self.requests = requests

    def vf_stats(self, pf: str) -> dict[int, vfsettings.VfStats]:
        if self.requests is not None:
            with self.requests.open("a") as log:
                log.write(pf + "\n")
        table = json.loads(self.path.read_text()) if self.path.exists() else {}
        if pf in table and table[pf] is None:
            raise netlink.LinkNotFound(f"PF {pf} not found")
        found = table.get(pf) or {}
        return {int(vf): vfsettings.VfStats(**fields) for vf, fields in found.items()} | {
            vf: vfsettings.VfStats() for vf in range(256) if str(vf) not in found
        }

    def close(self) -> None:
        pass


def default_vf_state(index: int) -> dict[str, Any]:
    # What igb reports for a fresh VF (see tests/vm/test_igb_smoke.py).
    return {
        "mac": ZERO_MAC,
        "vlan": 0,
        "qos": 0,
        "vlan_proto": vfsettings.VLAN_PROTO_8021Q,
        "spoofchk": True,
        "trust": False,
        "link_state": vfsettings.LINK_STATE_AUTO,
        "min_tx_rate": 0,
        "max_tx_rate": 0,
    }


def settings_of(flat: dict[str, Any]) -> vfsettings.PfSettings:
    """The settings a fake VF's state (:func:`default_vf_state`'s keys) stands for."""
    return vfsettings.PfSettings(
        vlan=vfsettings.Vlan(flat["vlan"], flat["qos"], flat["vlan_proto"]),
        mac=flat["mac"],
        rate=vfsettings.Rate(flat["min_tx_rate"], flat["max_tx_rate"]),
        spoofchk=flat["spoofchk"],
        trust=flat["trust"],
        link_state=flat["link_state"],
    )


class FakeVfControl:
    """:class:`netlink.VfControl` in memory; records every set call in order.

    ``refuse[setting] = exception`` makes that setter raise (after recording
    the attempt) without changing anything, as a driver that cannot do it.
    """

    def __init__(self) -> None:
        self.state: dict[str, dict[int, dict[str, Any]]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: dict[str, Exception] = {}
        self.closed = 0

    def close(self) -> None:
        # KernelVfControl holds a netlink socket; the plugin must close it.
        self.closed += 1

    def add_pf(self, pf: str, nvfs: int) -> None:
        self.state[pf] = {i: default_vf_state(i) for i in range(nvfs)}

    def snapshot(self) -> dict[str, dict[int, dict[str, Any]]]:
        return copy.deepcopy(self.state)

    def _vf(self, pf: str, vf: int) -> dict[str, Any]:
        if pf not in self.state:
            raise netlink.LinkNotFound(f"PF {pf} not found")
        if vf not in self.state[pf]:
            raise netlink.InvalidArgument(f"{pf} has no VF {vf}")
        return self.state[pf][vf]

    def _set(self, setting: str, pf: str, vf: int, value: Any, **changes: Any) -> None:
        self.calls.append((setting, pf, vf, value))
        target = self._vf(pf, vf)
        if setting in self.refuse:
            raise self.refuse[setting]
        target.update(changes)

    def vfs(self, pf: str) -> dict[int, PfSettings]:
        if pf not in self.state:
            raise netlink.LinkNotFound(f"PF {pf} not found")
        return {i: settings_of(s) for i, s in self.state[pf].items()}

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._set("mac", pf, vf, mac, mac=mac)

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        if vlan > 4095 or qos > 7:
            # rtnetlink refuses these itself, before any driver sees them.
            raise netlink.InvalidArgument(f"setting VLAN {vlan} qos {qos} on {pf} VF {vf}: Invalid argument", 22)
        self._set("vlan", pf, vf, (vlan, qos, proto), vlan=vlan, qos=qos, vlan_proto=proto)

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._set("spoofchk", pf, vf, on, spoofchk=on)

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._set("trust", pf, vf, on, trust=on)

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._set("link_state", pf, vf, state, link_state=state)

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None:
        self._set("rate", pf, vf, (min_tx_rate, max_tx_rate), min_tx_rate=min_tx_rate, max_tx_rate=max_tx_rate)


class SharedFakeVfControl:
    """The host fixtures' fake PF side, kept in a file so forked calls share it.

    Every operation is read-modify-write under flock, so a call killed at any
    point leaves the file either before or after a setting, as a PF would.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fake = FakeVfControl()

    @contextmanager
    def _state(self, write: bool) -> Iterator[FakeVfControl]:
        # A lock file of its own: the state file is replaced by rename, and a
        # lock on a replaced inode would exclude nobody.
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            raw = json.loads(self.path.read_text()) if self.path.exists() else {}
            self.fake.state = {pf: {int(i): s for i, s in vfs.items()} for pf, vfs in raw.items()}
            yield self.fake
            if write:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.fake.state))
                os.rename(tmp, self.path)

    def snapshot(self) -> dict[str, Any]:
        with self._state(False) as fake:
            return copy.deepcopy(fake.state)

    def add_pf(self, pf: str, nvfs: int) -> None:
        with self._state(True) as fake:
            fake.add_pf(pf, nvfs)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # vfs() and the set_* calls of netlink.VfControl, each under the lock.
        def call(*args: Any) -> Any:
            with self._state(name != "vfs") as fake:
                return getattr(fake, name)(*args)

        return call


# --- the VF store ---------------------------------------------------------------


class MemoryVfStore:
    """In-memory :class:`Store`, the fake the conformance suite holds to FileStore's contract."""

    def __init__(self) -> None:
        self._records: dict[str, str] = {}
        self._aside: dict[str, str] = {}
        # Guards the claims, and lets all() read the records while other
        # threads, each under a claim, change them.
        self._lock = threading.Lock()
        self._claimed: set[str] = set()

    def claim(self, vf_pci: str, wait: float = 0.0) -> Claim | None:
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                if vf_pci not in self._claimed:
                    self._claimed.add(vf_pci)
                    return Claim(lambda: self._claimed.discard(vf_pci))
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def all(self) -> list[Allocation]:
        with self._lock:
            texts = [text for _, text in sorted(self._records.items())]
        return [Allocation.from_json(text) for text in texts]

    def ids(self) -> AbstractSet[str]:
        return self._records.keys()

    def has(self, vf_pci: str) -> bool:
        return vf_pci in self._records

    def get(self, vf_pci: str) -> Allocation | None:
        text = self._records.get(vf_pci)
        return Allocation.from_json(text) if text is not None else None

    def put(self, alloc: Allocation) -> None:
        # Stored serialized, like the file store, so callers never share
        # mutable records with the store.
        text = alloc.to_json()
        with self._lock:
            self._records[alloc.vf_pci] = text

    def remove(self, vf_pci: str) -> None:
        with self._lock:
            self._records.pop(vf_pci, None)

    def set_aside(self, record: SetAside) -> None:
        text = record.to_json()
        with self._lock:
            self._aside[record.vf_pci] = text

    def aside(self) -> dict[str, SetAside]:
        with self._lock:
            texts = sorted(self._aside.items())
        return {pci: SetAside.from_json(text) for pci, text in texts}

    def unset_aside(self, vf_pci: str) -> None:
        with self._lock:
            self._aside.pop(vf_pci, None)


# --- IPAM's reservations ---------------------------------------------------------


class MemoryReservationStore:
    """In-memory :class:`ReservationStore` with the disk store's semantics, for the allocator's tests."""

    def __init__(self) -> None:
        self.ips: dict[IPAddress, Owner] = {}
        self.last: dict[int, IPAddress] = {}
        self.hints: dict[Owner, list[IPAddress]] = {}
        self.lock_depth = 0

    def exists(self) -> bool:
        return bool(self.ips or self.last or self.hints)

    def _require_lock(self) -> None:
        # The disk store cannot notice an unlocked write; the fake refuses
        # one, so allocator tests catch a missing locked().
        if not self.lock_depth:
            raise RuntimeError("store mutated outside locked()")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_depth += 1
        try:
            yield
        finally:
            self.lock_depth -= 1

    def locked(self) -> AbstractContextManager[None]:
        return self._locked()

    def reserve(self, ip: IPAddress, owner: Owner) -> bool:
        self._require_lock()
        if ip in self.ips:
            return False
        self.ips[ip] = owner
        return True

    def release(self, ip: IPAddress) -> None:
        self._require_lock()
        self.ips.pop(ip, None)

    def owner_of(self, ip: IPAddress) -> Owner | None:
        return self.ips.get(ip)

    def reservations(self) -> Iterator[tuple[IPAddress, Owner]]:
        yield from list(self.ips.items())

    def reserved(self) -> Collection[IPAddress]:
        return frozenset(self.ips)

    def last_reserved(self, set_index: int) -> IPAddress | None:
        return self.last.get(set_index)

    def set_last_reserved(self, set_index: int, ip: IPAddress) -> None:
        self._require_lock()
        self.last[set_index] = ip

    def hint(self, owner: Owner) -> list[IPAddress]:
        return list(self.hints.get(owner, []))

    def set_hint(self, owner: Owner, ips: list[IPAddress]) -> None:
        self._require_lock()
        if ips:
            self.hints[owner] = list(ips)
        else:
            self.hints.pop(owner, None)

    def hinted(self) -> list[Owner]:
        return list(self.hints)


# --- the node's links and the host namespace ------------------------------------


class FakeLinks:
    """Link changes as the kernel would reflect them in the tree."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.calls: list[tuple[str, str, int | None]] = []
        # The PF's reading of each VF's MAC, by (PF, VF index); zero when unset.
        self.macs: dict[tuple[str, int], str] = {}

    def set_up(self, netdev: str) -> None:
        self.calls.append(("up", netdev, None))
        (self.tree.sys / "class" / "net" / netdev / "flags").write_text("0x1003\n")

    def set_mtu(self, netdev: str, mtu: int) -> None:
        self.calls.append(("mtu", netdev, mtu))
        (self.tree.sys / "class" / "net" / netdev / "mtu").write_text(f"{mtu}\n")

    def open_vf_once(self, pf: str, vf: int, netdev: str) -> None:
        self.calls.append(("open once", netdev, vf))

    def vf_macs(self, pf: str) -> dict[int, str]:
        pci = sysfs.resolve_pf(self.tree.sys, pf).pci
        return {i: self.macs.get((pf, i), ZERO_MAC) for i in sysfs.vf_pcis(self.tree.sys, pci)}

    def set_vf_mac(self, pf: str, vf: int, mac: str) -> None:
        self.calls.append(("vf mac " + mac, pf, vf))
        self.macs[(pf, vf)] = mac


class FakeHost:
    """The host namespace as far as ``find`` goes: the netdevs the tree lists under class/net."""

    def __init__(self, sys_root: Path) -> None:
        self.sys_root = sys_root

    def find(self, name: str) -> object | None:
        return object() if (self.sys_root / "class" / "net" / name).exists() else None


def _conforms(
    vfc: FakeVfControl,
    store: MemoryVfStore,
    links: FakeLinks,
    host: FakeHost,
    file_store: FileStore,
    reservations: MemoryReservationStore,
    vf_stats: FileVfStats,
) -> tuple[VfControl, Store, Links, Host, Store, ReservationStore, VfStatsReader]:
    # Checked by mypy: each fake satisfies the protocol it stands in for.
    return vfc, store, links, host, file_store, reservations, vf_stats
