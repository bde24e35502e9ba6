"""A VF's PF-side settings: their values, how the PF reports them, and the operations on them.

The settings live on the PF (admin MAC, VLAN, spoofchk, trust, link state,
rates) and are changed through the PF's netdev.  Callers depend on the
:class:`VfControl` protocol, so tests without SR-IOV hardware substitute a
fake for exactly this part; the kernel implementation is
:class:`sriov_cni.vfcontrol.KernelVfControl`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

VLAN_PROTO_8021Q = 0x8100
VLAN_PROTO_8021AD = 0x88A8

LINK_STATE_AUTO = 0
LINK_STATE_ENABLE = 1
LINK_STATE_DISABLE = 2


@dataclass(frozen=True)
class VfInfo:
    """A VF's PF-side settings as the PF reports them (``None``: not reported)."""

    index: int
    mac: str
    vlan: int
    qos: int
    vlan_proto: int
    spoofchk: bool | None
    trust: bool | None
    link_state: int | None
    min_tx_rate: int
    max_tx_rate: int


class VfControl(Protocol):
    """PF-side VF operations, addressed by PF netdev name and VF index."""

    def vfs(self, pf: str) -> dict[int, VfInfo]: ...

    def set_mac(self, pf: str, vf: int, mac: str) -> None: ...

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None: ...

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None: ...

    def set_trust(self, pf: str, vf: int, on: bool) -> None: ...

    def set_link_state(self, pf: str, vf: int, state: int) -> None: ...

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None: ...
