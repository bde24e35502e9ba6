"""Handing out, finding and releasing addresses with host-local's semantics.

Allocation cost must not grow with the pool's fill level, so an ADD never
lists the directory up front as host-local does: it probes candidates with
exclusive creates from the round-robin position.  Only after PROBE_LIMIT
misses does it list the directory once, and keeps probing from there
skipping what the listing showed taken.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from sriov_cni.cni import CNIError, Code, IPAddress

from .config import IPAMConfig, Range, RangeSet, Requested
from .store import Owner, ReservationStore

logger = logging.getLogger(__name__)

# A failed probe costs ~7 us and listing a 65k-entry directory ~50 ms, so
# after this many misses the listing is at most about as costly again as the
# probing already done.
PROBE_LIMIT = 4096


@dataclass(frozen=True)
class Reservation:
    """An address of a range: one this call reserved or holds, or a candidate for it."""

    ip: IPAddress
    range: Range


def candidates(rset: RangeSet, last: IPAddress | None) -> Iterator[Reservation]:
    """Every address ``rset`` can hand out, once each, in round-robin order.

    Starts just after ``last`` when it lies in the set (host-local's
    last_reserved_ip), else at the first range's start; walks to the end of
    each range, on through the following ranges, wraps, and ends with
    ``last`` itself.
    """
    at = None if last is None else rset.position(last)
    if at is None or last is None:
        segments = [(r, int(r.start), int(r.end)) for r in rset.ranges]
    else:
        here = rset.ranges[at]
        others = rset.ranges[at + 1 :] + rset.ranges[:at]
        segments = [
            (here, int(last) + 1, int(here.end)),
            *((r, int(r.start), int(r.end)) for r in others),
            (here, int(here.start), int(last)),
        ]
    for r, low, high in segments:
        skipped = {int(ip) for ip in r.skipped}
        make = type(r.start)
        for n in range(low, high + 1):
            if n not in skipped:
                yield Reservation(make(n), r)


def _verified_hint(store: ReservationStore, owner: Owner) -> list[IPAddress]:
    # host-local may have released (and even re-issued) a hinted address
    # without touching the hint, so only the address file is authoritative.
    return [ip for ip in store.hint(owner) if store.owner_of(ip) == owner]


def _held(store: ReservationStore, owner: Owner) -> list[IPAddress]:
    """What ``owner`` holds: the hint if it still holds, else a full scan.

    The scan finds reservations host-local made, which our hint never saw;
    like host-local, it falls back to legacy ID-only files when no file
    names the interface.
    """
    ips = _verified_hint(store, owner)
    if ips:
        return ips
    claimed = [(ip, held_by) for ip, held_by in store.reservations() if held_by.is_claimed_by(owner)]
    exact = [ip for ip, held_by in claimed if held_by == owner]
    return exact or [ip for ip, _ in claimed]


def _reserve_requested(store: ReservationStore, rset: RangeSet, owner: Owner, want: Requested) -> Reservation:
    if not store.reserve(want.address, owner):
        holder = store.owner_of(want.address)
        if holder != owner:
            by = f" by container {holder.container_id} interface {holder.ifname}" if holder else ""
            raise CNIError(Code.INVALID_CONFIG, f"{want.field} {want.address} is already reserved{by}")
    return Reservation(want.address, want.range)


def _reserve_next(
    store: ReservationStore, rset: RangeSet, owner: Owner, probe_limit: int, listed: Callable[[], Collection[IPAddress]]
) -> Reservation:
    order = candidates(rset, store.last_reserved(rset.index))
    found = next((a for a in itertools.islice(order, probe_limit) if store.reserve(a.ip, owner)), None)
    if found is None:
        taken = listed()
        found = next((a for a in order if a.ip not in taken and store.reserve(a.ip, owner)), None)
    if found is None:
        raise CNIError(
            Code.NOT_AVAILABLE,
            f"no free addresses left in range set {rset.field}",
            "; ".join(str(r) for r in rset.ranges),
        )
    return found


def allocate(
    store: ReservationStore,
    cfg: IPAMConfig,
    owner: Owner,
    requested: dict[int, Requested],
    *,
    probe_limit: int = PROBE_LIMIT,
) -> list[Reservation]:
    """One address per range set for ``owner``; a repeated ADD gets the same ones.

    A free address is searched for by ``probe_limit`` probes before the store is listed.
    """
    with store.locked():
        held: dict[int, Reservation] = {}
        for ip in _verified_hint(store, owner):
            if (found := cfg.locate(ip)) is not None:
                held[found[0].index] = Reservation(ip, found[1])
        # Listed once for the whole ADD, not once per range set: a network of
        # many full range sets would list the store as many times.  What this
        # ADD reserves after the listing is refused by reserve() itself.
        listed = functools.cache(store.reserved)
        out: list[Reservation] = []
        fresh: list[IPAddress] = []
        try:
            for rset in cfg.range_sets:
                want = requested.get(rset.index)
                have = held.get(rset.index)
                if have is not None and want is not None and want.address != have.ip:
                    raise CNIError(
                        Code.INVALID_CONFIG,
                        f"{want.field} {want.address} conflicts with {have.ip}, which container "
                        f"{owner.container_id} interface {owner.ifname} already holds in {rset.field}",
                    )
                if have is None:
                    have = (
                        _reserve_requested(store, rset, owner, want)
                        if want
                        else _reserve_next(store, rset, owner, probe_limit, listed)
                    )
                    # Counted as fresh before anything else can fail, so a
                    # failing write of last_reserved_ip releases it too.
                    fresh.append(have.ip)
                    store.set_last_reserved(rset.index, have.ip)
                out.append(have)
            if fresh:
                store.set_hint(owner, [a.ip for a in out])
        except BaseException:
            # Nothing of a failed ADD may stay reserved.
            for ip in fresh:
                try:
                    store.release(ip)
                except OSError as exc:
                    logger.error("cannot roll back the reservation of %s: %s", ip, exc)
            raise
    return out


def release(store: ReservationStore, owner: Owner) -> None:
    """Release everything ``owner`` holds; holding nothing is success."""
    if not store.exists():
        return
    with store.locked():
        failed: list[tuple[IPAddress, OSError]] = []
        for ip in _held(store, owner):
            try:
                store.release(ip)
            except OSError as exc:
                failed.append((ip, exc))
        # Keep the hint pointing at what could not be released, so a retried
        # DEL finds it without a scan.
        store.set_hint(owner, [ip for ip, _ in failed])
    if failed:
        raise CNIError(
            Code.IO_FAILURE,
            f"cannot release {', '.join(str(ip) for ip, _ in failed)}",
            "; ".join(f"{exc.filename}: {exc.strerror}" for _, exc in failed),
        )


def check(store: ReservationStore, cfg: IPAMConfig, owner: Owner) -> None:
    """Fail unless ``owner`` holds an address in every range set."""
    held: list[IPAddress] = []
    if store.exists():
        with store.locked():
            held = _held(store, owner)
    covered = {found[0].index for ip in held if (found := cfg.locate(ip)) is not None}
    for rset in cfg.range_sets:
        if rset.index not in covered:
            raise CNIError(
                Code.IPAM,
                f"no address reserved in {rset.field} for container {owner.container_id} interface {owner.ifname}",
            )


def collect(store: ReservationStore, valid: set[Owner]) -> None:
    """GC: release every reservation whose owner is not in ``valid``."""
    if not store.exists():
        return
    valid_ids = {o.container_id for o in valid}
    failed: list[str] = []
    with store.locked():
        for ip, held_by in store.reservations():
            keep = held_by in valid if held_by.ifname is not None else held_by.container_id in valid_ids
            if keep:
                continue
            try:
                store.release(ip)
            except OSError as exc:
                # The spec asks GC to carry on and report at the end.
                failed.append(f"{ip}: {exc.strerror}")
        for hinted in store.hinted():
            if hinted not in valid:
                try:
                    store.set_hint(hinted, [])
                except OSError as exc:
                    failed.append(f"{exc.filename}: {exc.strerror}")
    if failed:
        raise CNIError(Code.IO_FAILURE, f"GC could not release {len(failed)} entries", "; ".join(failed))


def status(store: ReservationStore, cfg: IPAMConfig) -> None:
    """Fail with NOT_AVAILABLE when some range set has no address left."""
    # One pass over the reservations, each charged to the set whose range
    # holds it: a pass per range set was (sets x reservations).
    used: collections.Counter[int] = collections.Counter()
    for ip in store.reserved():
        found = cfg.locate(ip)
        if found is not None and ip not in found[1].skipped:
            used[found[0].index] += 1
    for rset in cfg.range_sets:
        capacity = rset.capacity()
        if used[rset.index] >= capacity:
            raise CNIError(
                Code.NOT_AVAILABLE,
                f"range set {rset.field} is exhausted: all {capacity} addresses are reserved",
                "; ".join(str(r) for r in rset.ranges),
            )
