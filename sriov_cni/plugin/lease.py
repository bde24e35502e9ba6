"""One VF held for one attachment: its record and its claim.

ADD gets a lease from :func:`sriov_cni.plugin.allocate.reserve`, which
took the claim before it recorded the VF (a :class:`NewLease`, which also
carries the VF as sysfs described it then); DEL and GC make one from the
record they found and the claim they took afterwards.  A record changes
only under its VF's claim (see :mod:`sriov_cni.vfstore`), so while a
lease's holder keeps the claim nobody else can change the record: writes
through the lease need no lock and no check.

DEL and GC read the record before they had the claim, and the call they
waited for may have changed it meanwhile: an ADD may have reclaimed the VF
(its pod's netns was gone), or the attachment's own ADD, still running when
the DEL came, may have recorded what it changed since.  So they check
:meth:`Lease.owned` first, under the claim, and act on the record as it is
then.
"""

from __future__ import annotations

from typing import Self

from sriov_cni.kernel.sysfs import VfDevice
from sriov_cni.vfstore import Allocation, Claim, Store


class Lease:
    """``alloc`` under ``claim``.

    Used as a context manager, the claim is dropped on exit.
    """

    def __init__(self, store: Store, alloc: Allocation, claim: Claim) -> None:
        self.store = store
        self.alloc = alloc
        self.claim = claim

    def owned(self) -> bool:
        """Whether the store still gives the VF to this attachment; if so, ``alloc`` becomes its record as it is now.

        For a lease made from a record read before the claim was taken: a
        give-back must follow what the record says now (a snapshot, PF
        settings, the move into the pod), not what it said then.
        """
        current = self.store.get(self.alloc.vf_pci)
        if current is None or not current.owned_by(self.alloc.container_id, self.alloc.ifname, self.alloc.network):
            return False
        self.alloc = current
        return True

    def save(self) -> None:
        """Write ``alloc`` over its record."""
        self.store.put(self.alloc)

    def forget(self) -> None:
        """Remove the record."""
        self.store.remove(self.alloc.vf_pci)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.claim.drop()


class NewLease(Lease):
    """ADD's lease on the VF it took: ``vf`` is that VF as sysfs described it when it was chosen.

    Every later step of the ADD takes the VF's PF, index, driver and netdev
    from it rather than reading sysfs again.  ``stale`` is the dead
    container's record the new one replaced, if any.
    """

    def __init__(
        self, store: Store, alloc: Allocation, claim: Claim, vf: VfDevice, stale: Allocation | None = None
    ) -> None:
        super().__init__(store, alloc, claim)
        self.vf = vf
        self.stale = stale
