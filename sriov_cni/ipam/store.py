"""Where reservations live: host-local's on-disk layout.

Layout of ``<dataDir>/<network>/`` (shared with host-local, so either tool
can run against the other's pool):

* ``<ip>``: one file per reserved address, holding ``containerID\\r\\nifname``
  (older host-local wrote only ``containerID``), created ``O_EXCL`` 0600.
* ``last_reserved_ip.<N>``: the address range set N handed out last.
* ``lock``: both tools ``flock`` it around every read-modify-write.
* ``attachment:<containerID>:<ifname>`` (ours alone): the addresses that
  attachment holds, one per line, so a repeated ADD, a DEL or a CHECK need
  not read every file.  host-local never updates it (its name is not an
  address, so host-local skips it), hence it is only a hint: every address
  in it is verified against its ``<ip>`` file before use.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import filelock

from sriov_cni import safepath
from sriov_cni.cni import CNIError, Code, IPAddress

# host-local separates container ID and interface name with CRLF.
LINE_BREAK = "\r\n"
LOCK_NAME = "lock"
LAST_RESERVED_PREFIX = "last_reserved_ip."
HINT_PREFIX = "attachment:"
# Long enough to ride out a burst of parallel ADDs, short enough to answer
# "try again" well before a runtime gives up on the call.
LOCK_TIMEOUT = 30.0
# filelock waits by polling the flock.  Each poll costs CPU the holder
# needs: with 64 waiters on 2 CPUs, 2 ms polls starved the holder until
# waiters hit the timeout.  At 10 ms a crowd still finds the lock taken
# again within a fraction of a millisecond, and a lone waiter loses at
# most 10 ms.
LOCK_POLL = 0.01


@dataclass(frozen=True)
class Owner:
    """Who holds an address.  ``ifname`` is None for a legacy ID-only file."""

    container_id: str
    ifname: str | None

    def encode(self) -> bytes:
        if self.ifname is None:
            return self.container_id.encode()
        return f"{self.container_id}{LINE_BREAK}{self.ifname}".encode()

    @classmethod
    def decode(cls, data: bytes) -> Owner:
        # host-local trims whitespace around the whole content before comparing.
        container_id, sep, ifname = data.decode(errors="replace").strip().partition(LINE_BREAK)
        return cls(container_id.strip(), ifname if sep else None)

    def is_claimed_by(self, attachment: Owner) -> bool:
        """Whether a reservation held by ``self`` belongs to ``attachment``."""
        if self.ifname is None:
            return self.container_id == attachment.container_id
        return self == attachment


class ReservationStore(Protocol):
    """Reservation storage.  Mutating calls require ``locked()`` to be held."""

    def exists(self) -> bool:
        """Whether anything was ever stored; False lets DEL/GC/CHECK stop early."""
        ...

    def locked(self) -> AbstractContextManager[None]:
        """Exclusive access to the network's reservations, shared with host-local."""
        ...

    def reserve(self, ip: IPAddress, owner: Owner) -> bool:
        """Claim ``ip`` for ``owner``; False if it is already taken."""
        ...

    def release(self, ip: IPAddress) -> None:
        """Drop the reservation of ``ip``; a missing one is not an error."""
        ...

    def owner_of(self, ip: IPAddress) -> Owner | None: ...

    def reservations(self) -> Iterator[tuple[IPAddress, Owner]]:
        """Every reservation, read one by one: costs a read per address."""
        ...

    def reserved(self) -> Collection[IPAddress]:
        """The reserved addresses, without their owners: one directory listing."""
        ...

    def last_reserved(self, set_index: int) -> IPAddress | None: ...

    def set_last_reserved(self, set_index: int, ip: IPAddress) -> None: ...

    def hint(self, owner: Owner) -> list[IPAddress]:
        """Addresses ``owner`` was last known to hold; unverified."""
        ...

    def set_hint(self, owner: Owner, ips: list[IPAddress]) -> None:
        """Record ``owner``'s addresses; an empty list forgets the owner."""
        ...

    def hinted(self) -> list[Owner]:
        """Owners with a recorded hint."""
        ...


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class _ReservedNames(Collection[IPAddress]):
    """A directory listing seen as addresses.

    Membership compares file names, so probing many candidates after one
    listing does not parse tens of thousands of names.
    """

    def __init__(self, names: list[str]) -> None:
        self._names = frozenset(names)

    def __contains__(self, ip: object) -> bool:
        return str(ip) in self._names

    def __iter__(self) -> Iterator[IPAddress]:
        for name in self._names:
            ip = _parse_ip(name)
            if ip is not None:
                yield ip

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _write(path: str, data: bytes, flags: int) -> None:
    # O_NOFOLLOW: a symlink planted as last_reserved_ip.0 or a hint must not
    # redirect a root write.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class DiskStore:
    """host-local's store: ``<data_dir>/<network>/``."""

    def __init__(self, data_dir: str, network: str, lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.dir = os.path.join(data_dir, network)
        self._lock = filelock.UnixFileLock(
            os.path.join(self.dir, LOCK_NAME), timeout=lock_timeout, poll_interval=LOCK_POLL
        )

    def _path(self, name: object) -> str:
        # str() of an address is the canonical form host-local's Go code
        # writes too (dotted quad; RFC 5952 for IPv6).
        return os.path.join(self.dir, str(name))

    def exists(self) -> bool:
        return os.path.isdir(self.dir)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Every component checked, none a symlink; created 0755 like
        # host-local does, and refused when others may write in it.
        safepath.state_dir(self.dir, 0o755)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise CNIError(
                Code.TRY_AGAIN,
                f"the address store {self.dir} is busy, try again later",
                f"{self._lock.lock_file} stayed locked for {self._lock.timeout} s",
            ) from None
        try:
            yield
        finally:
            self._lock.release()

    def locked(self) -> AbstractContextManager[None]:
        return self._locked()

    def reserve(self, ip: IPAddress, owner: Owner) -> bool:
        path = self._path(ip)
        try:
            _write(path, owner.encode(), os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return False
        except OSError:
            # A half-written reservation (disk full) would hold the address
            # for nobody; remove it before reporting.
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        return True

    def release(self, ip: IPAddress) -> None:
        try:
            os.unlink(self._path(ip))
        except FileNotFoundError:
            pass

    def _read(self, name: object) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def owner_of(self, ip: IPAddress) -> Owner | None:
        data = self._read(ip)
        return None if data is None else Owner.decode(data)

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.dir)
        except FileNotFoundError:
            return []

    def reservations(self) -> Iterator[tuple[IPAddress, Owner]]:
        for name in self._names():
            ip = _parse_ip(name)
            if ip is None:
                continue
            owner = self.owner_of(ip)
            # Released by someone else since the listing.
            if owner is not None:
                yield ip, owner

    def reserved(self) -> Collection[IPAddress]:
        return _ReservedNames(self._names())

    def last_reserved(self, set_index: int) -> IPAddress | None:
        data = self._read(f"{LAST_RESERVED_PREFIX}{set_index}")
        return None if data is None else _parse_ip(data.decode(errors="replace").strip())

    def set_last_reserved(self, set_index: int, ip: IPAddress) -> None:
        _write(self._path(f"{LAST_RESERVED_PREFIX}{set_index}"), str(ip).encode(), os.O_CREAT | os.O_TRUNC)

    @staticmethod
    def _hint_name(owner: Owner) -> str:
        # ':' appears in neither a container ID nor an interface name, so the
        # name maps back to exactly one owner.
        return f"{HINT_PREFIX}{owner.container_id}:{owner.ifname}"

    def hint(self, owner: Owner) -> list[IPAddress]:
        data = self._read(self._hint_name(owner))
        if data is None:
            return []
        parsed = (_parse_ip(line) for line in data.decode(errors="replace").split())
        return [ip for ip in parsed if ip is not None]

    def set_hint(self, owner: Owner, ips: list[IPAddress]) -> None:
        path = self._path(self._hint_name(owner))
        if ips:
            _write(path, "".join(f"{ip}\n" for ip in ips).encode(), os.O_CREAT | os.O_TRUNC)
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def hinted(self) -> list[Owner]:
        out = []
        for name in self._names():
            if name.startswith(HINT_PREFIX):
                container_id, _, ifname = name[len(HINT_PREFIX) :].partition(":")
                out.append(Owner(container_id, ifname))
        return out


if TYPE_CHECKING:
    # mypy proves here that the disk store satisfies ReservationStore (the
    # tests' in-memory one is held to it in tests/support/fakes.py); nothing runs.
    _disk: ReservationStore = DiskStore("/var/lib/cni/networks", "net")
