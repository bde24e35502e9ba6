"""One VF held for one attachment: its record, its claim, and the record protocol.

ADD gets a lease from :func:`sriov_cni.plugin.allocate.reserve`; DEL and GC make
one from the record they found and the claim they took.  Every write
through a lease first checks, under the store lock, that the record still
belongs to the same attachment: an ADD that reclaimed a stale VF (its pod's
netns vanished) while a slow call ran must not have its record overwritten
or removed by that call.
"""

from __future__ import annotations

from sriov_cni.cni import CNIError, Code
from sriov_cni.plugin.store import Allocation, Claim, Store


class Lease:
    """``alloc`` (with ``stale``, the dead container's record it replaced, if any) under ``claim``.

    Used as a context manager, the claim is released on exit.
    """

    def __init__(self, store: Store, alloc: Allocation, claim: Claim, stale: Allocation | None = None) -> None:
        self.store = store
        self.alloc = alloc
        self.claim = claim
        self.stale = stale

    def _owned(self) -> bool:
        # Under store.locked().
        current = self.store.get(self.alloc.vf_pci)
        return current is not None and current.owned_by(self.alloc.container_id, self.alloc.ifname, self.alloc.network)

    def owned(self) -> bool:
        """Whether the store still gives the VF to this attachment."""
        with self.store.locked():
            return self._owned()

    def save(self) -> None:
        """Write ``alloc`` over its record; raises CNIError if another attachment took the VF."""
        # Written and synced before the lock, renamed into place under it: the
        # lock is held for the ownership check and a rename, not an fsync.
        staged = self.store.stage(self.alloc)
        try:
            with self.store.locked():
                if not self._owned():
                    raise CNIError(Code.DEVICE, f"VF {self.alloc.vf_pci} was taken over while this ADD ran")
                self.store.commit(staged)
        finally:
            self.store.discard(staged)

    def forget(self) -> None:
        """Remove the record, if it is still this attachment's."""
        with self.store.locked():
            if self._owned():
                self.store.remove(self.alloc.vf_pci)

    def release(self) -> None:
        self.claim.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
