"""A VF's PF-side settings: their values, how the PF reports them, and the operations on them.

The settings live on the PF (admin MAC, VLAN, spoofchk, trust, link state,
rates) and are changed through the PF's netdev.  Callers depend on the
:class:`VfControl` protocol, so tests without SR-IOV hardware substitute a
fake for exactly this part; the kernel implementation is
:class:`sriov_cni.kernel.vfcontrol.KernelVfControl`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple, Protocol

VLAN_PROTO_8021Q = 0x8100
VLAN_PROTO_8021AD = 0x88A8

# PF drivers whose reading of a VF's MAC (IFLA_VF_MAC) is the VF's entry in
# the PF's receive filter, which the VF driver fills with its own MAC when no
# admin MAC is set (igb: vf_mac_addresses, ixgbe: the same, both written by
# an admin MAC write and by the VF's own MAC request).  With these a reading
# other than the VF netdev's MAC, zero included, means the VF does not
# receive its own unicast traffic.  Other drivers report the admin MAC only
# (mlx5: zero when none is set), so there only a non-zero reading can differ.
OWN_MAC_IN_READING = frozenset({"igb", "ixgbe"})

# The PF's reading of a VF's MAC when no MAC is set for it; writing it lifts an admin MAC.
ZERO_MAC = "00:00:00:00:00:00"

LINK_STATE_AUTO = 0
LINK_STATE_ENABLE = 1
LINK_STATE_DISABLE = 2


class Vlan(NamedTuple):
    id: int
    qos: int
    proto: int


class Rate(NamedTuple):
    """Transmit rate limits in Mbit/s; 0 is no limit."""

    min_tx: int
    max_tx: int


@dataclass(frozen=True)
class PfSettings:
    """A VF's settings held at the PF, fields in the order ADD applies them.

    One type for the PF's reading of a VF, the snapshot a record keeps and
    what ADD applies.  ``None`` means "not in this value": in a reading, a
    setting the driver does not report; in what ADD applies, one the
    configuration leaves alone.  ``mac`` is the PF's MAC for the VF: the
    administrative one, or what the VF programmed itself where none is set.
    """

    vlan: Vlan | None = None
    mac: str | None = None
    rate: Rate | None = None
    spoofchk: bool | None = None
    trust: bool | None = None
    link_state: int | None = None

    def items(self) -> list[tuple[str, Any]]:
        """(name, value) of every setting in this value, in application order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def without(self, names: Iterable[str]) -> PfSettings:
        return replace(self, **{name: None for name in names})


class VfControl(Protocol):
    """PF-side VF operations, addressed by PF netdev name and VF index."""

    def vfs(self, pf: str) -> dict[int, PfSettings]:
        """The PF's reading of each of its VFs, by VF index."""
        ...

    def set_mac(self, pf: str, vf: int, mac: str) -> None: ...

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None: ...

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None: ...

    def set_trust(self, pf: str, vf: int, on: bool) -> None: ...

    def set_link_state(self, pf: str, vf: int, state: int) -> None: ...

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None: ...


@dataclass(frozen=True)
class VfStats:
    """One VF's traffic as its PF counts it (the kernel's IFLA_VF_STATS), from the VF's side.

    ``rx_*`` is what the VF received, ``tx_*`` what it sent; ``broadcast``
    and ``multicast`` are packets it received (as mlx5 and ice fill them).
    A driver without the operation (``ndo_get_vf_stats``) reports zeros.
    """

    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    broadcast: int = 0
    multicast: int = 0
    rx_dropped: int = 0
    tx_dropped: int = 0


class VfStatsReader(Protocol):
    """The PF's counters of each of its VFs, by VF index: one request per PF."""

    def vf_stats(self, pf: str) -> dict[int, VfStats]: ...

    def close(self) -> None: ...
