"""PF-side VF settings through the kernel: :class:`KernelVfControl`, over netlink."""

from __future__ import annotations

import errno
import struct
from typing import Any

from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg as _ifinfmsg

from sriov_cni.kernel import rtnl
from sriov_cni.kernel.links import translate
from sriov_cni.kernel.nlerrors import LinkNotFound
from sriov_cni.kernel.rtnl import Rtnl, message
from sriov_cni.kernel.vfsettings import VLAN_PROTO_8021Q, PfSettings, Rate, VfStats, Vlan

# pyroute2's table gives IFLA_VF_VLAN_INFO 14 bytes, but the kernel's
# struct ifla_vf_vlan_info is 16 (two bytes of tail padding), and kernels
# that validate the nested VLAN list (commit 1aec77b2bb2e, backported to
# stable) reject the short form with EINVAL.  The list form is the only way
# to set an 802.1ad VLAN, so that request writes the struct at its real
# size.  pyroute2's table itself stays as it is: every other user of
# pyroute2 in the process shares it.  Reading the kernel's answers does not
# use it.
_IVVI = _ifinfmsg.vflist.vfinfo.vf_vlist.ivvi
_VLAN_INFO_SIZED = {_IVVI: (*_IVVI.fields, ("__pad", "H")) if len(_IVVI.fields) == 4 else _IVVI.fields}

RTEXT_FILTER_VF = 1 << 0
# Leaves out each VF's counters (IFLA_VF_STATS), which nothing here reads: with
# many VFs they are a large part of a PF's answer to send and decode.  The
# flag covers VF counters only; kernels older than it ignore it.
RTEXT_FILTER_SKIP_STATS = 1 << 3


_IFLA_VFINFO_LIST = rtnl.numbers(_ifinfmsg)["IFLA_VFINFO_LIST"]
_IFLA_VF_INFO = rtnl.numbers(_ifinfmsg.vflist)["IFLA_VF_INFO"]
_VF = rtnl.numbers(_ifinfmsg.vflist.vfinfo)
_IFLA_VF_VLAN_INFO = rtnl.numbers(_ifinfmsg.vflist.vfinfo.vf_vlist)["IFLA_VF_VLAN_INFO"]
# The kernel's structs behind those attributes; each starts with the VF's number.
_VF_MAC = struct.Struct("=I32s")  # struct ifla_vf_mac
_VF_U32S = struct.Struct("=III")  # ifla_vf_vlan (vf, vlan, qos), ifla_vf_rate (vf, min, max)
_VF_SETTING = struct.Struct("=II")  # ifla_vf_spoofchk, _trust, _link_state: vf, setting
_VLAN_PROTO = struct.Struct("!H")  # ifla_vf_vlan_info's __be16 vlan_proto, after vf, vlan, qos
_IFLA_VF_STATS = _VF["IFLA_VF_STATS"]
# VfStats' fields by the number of their attribute in IFLA_VF_STATS, each a u64.
_STATS = {
    number: name.removeprefix("IFLA_VF_STATS_").lower()
    for name, number in rtnl.numbers(_ifinfmsg.vflist.vfinfo.vf_stats).items()
    if name != "IFLA_VF_STATS_PAD"
}
_U64 = struct.Struct("=Q")


def _vf_info(vfinfo: memoryview) -> tuple[int, PfSettings] | None:
    """One VF's settings, by its number; None when the kernel names no VF (no IFLA_VF_MAC)."""
    attrs = rtnl.attributes(vfinfo, 0)

    def first(name: str) -> memoryview | None:
        found = attrs.get(_VF[name])
        return found[0] if found else None

    def setting(name: str) -> int | None:
        payload = first(name)
        if payload is None:
            return None
        value: int = _VF_SETTING.unpack_from(payload)[1]
        # Drivers that do not implement a setting report it as (u32)-1.
        return None if value == 0xFFFFFFFF else value

    named = first("IFLA_VF_MAC")
    if named is None:
        return None
    vf, mac = _VF_MAC.unpack_from(named)
    vlan, rate, vlist = first("IFLA_VF_VLAN"), first("IFLA_VF_RATE"), first("IFLA_VF_VLAN_LIST")
    proto = VLAN_PROTO_8021Q
    if vlist is not None:
        infos = rtnl.attributes(vlist, 0).get(_IFLA_VF_VLAN_INFO)
        if infos and len(infos[0]) >= _VF_U32S.size + _VLAN_PROTO.size:
            proto = _VLAN_PROTO.unpack_from(infos[0], _VF_U32S.size)[0] or proto
    _, vlan_id, qos = _VF_U32S.unpack_from(vlan) if vlan is not None else (vf, 0, 0)
    _, min_tx, max_tx = _VF_U32S.unpack_from(rate) if rate is not None else (vf, 0, 0)
    spoofchk, trust = setting("IFLA_VF_SPOOFCHK"), setting("IFLA_VF_TRUST")
    return vf, PfSettings(
        vlan=Vlan(vlan_id, qos, proto),
        mac=":".join(f"{b:02x}" for b in mac[:6]),
        rate=Rate(min_tx, max_tx),
        spoofchk=None if spoofchk is None else bool(spoofchk),
        trust=None if trust is None else bool(trust),
        link_state=setting("IFLA_VF_LINK_STATE"),
    )


def vf_stats(answer: bytes) -> dict[int, VfStats]:
    """Each VF's counters in a PF's RTM_NEWLINK answer, by VF index; none when the kernel left them out."""
    vflist = rtnl.attributes(answer).get(_IFLA_VFINFO_LIST)
    out: dict[int, VfStats] = {}
    for vfinfo in rtnl.attributes(vflist[0], 0).get(_IFLA_VF_INFO, []) if vflist else []:
        attrs = rtnl.attributes(vfinfo, 0)
        named, stats = attrs.get(_VF["IFLA_VF_MAC"]), attrs.get(_IFLA_VF_STATS)
        if not named or not stats:
            continue
        values = {
            _STATS[number]: _U64.unpack_from(payloads[0])[0]
            for number, payloads in rtnl.attributes(stats[0], 0).items()
            if number in _STATS and len(payloads[0]) >= _U64.size
        }
        out[_VF_MAC.unpack_from(named[0])[0]] = VfStats(**values)
    return out


class KernelVfStats:
    """:class:`~sriov_cni.kernel.vfsettings.VfStatsReader` through the kernel: one RTM_GETLINK per PF.

    The metrics' read, apart from :meth:`KernelVfControl.vfs`, which asks
    the kernel to leave the counters out for the plugin's sake.  One GET of
    the PF by name: the kernel holds RTNL while it fills that one answer,
    never for a dump of the node's links.
    """

    def __init__(self, sock: Rtnl | None = None) -> None:
        self._rtnl = sock

    def vf_stats(self, pf: str) -> dict[int, VfStats]:
        if self._rtnl is None:
            self._rtnl = Rtnl()
        msg = message(_ifinfmsg, {}, [("IFLA_IFNAME", pf), ("IFLA_EXT_MASK", RTEXT_FILTER_VF)])
        try:
            with translate(f"reading VF counters of {pf}"):
                [answer] = self._rtnl.request(RTM_GETLINK, msg)
        except LinkNotFound as exc:
            raise LinkNotFound(f"PF {pf} not found ({exc})", errno.ENODEV) from exc
        return vf_stats(answer)

    def close(self) -> None:
        if self._rtnl is not None:
            self._rtnl.close()
            self._rtnl = None


class KernelVfControl:
    """:class:`VfControl` through the kernel, in this process's namespace."""

    def __init__(self) -> None:
        self._rtnl: Rtnl | None = None

    def _handle(self) -> Rtnl:
        # One socket for the process, opened on first use: a CNI call
        # makes several VF requests in a row.
        if self._rtnl is None:
            self._rtnl = Rtnl()
        return self._rtnl

    def close(self) -> None:
        if self._rtnl is not None:
            self._rtnl.close()
            self._rtnl = None

    def _request(
        self, pf: str, what: str, msg_type: int, attrs: list[tuple[str, Any]], structs: rtnl.Structs | None = None
    ) -> list[bytes]:
        # The PF by name, in the request itself: the kernel looks it up, so
        # no separate look-up of its index is needed.
        msg = message(_ifinfmsg, {}, [("IFLA_IFNAME", pf), *attrs], structs)
        try:
            with translate(what):
                return self._handle().request(msg_type, msg)
        except LinkNotFound as exc:
            raise LinkNotFound(f"PF {pf} not found ({exc})", errno.ENODEV) from exc

    def vfs(self, pf: str) -> dict[int, PfSettings]:
        # Without RTEXT_FILTER_VF the kernel leaves VF info out.
        mask = ("IFLA_EXT_MASK", RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)
        [answer] = self._request(pf, f"reading VFs of {pf}", RTM_GETLINK, [mask])
        vflist = rtnl.attributes(answer).get(_IFLA_VFINFO_LIST)
        if not vflist:
            return {}
        infos = (_vf_info(v) for v in rtnl.attributes(vflist[0], 0).get(_IFLA_VF_INFO, []))
        return dict(info for info in infos if info is not None)

    def _set_vf(self, pf: str, vf: int, what: str, attr: tuple[str, Any], structs: rtnl.Structs | None = None) -> None:
        """One VF setting: ``attr`` nested in IFLA_VFINFO_LIST/IFLA_VF_INFO of the PF."""
        vfinfo = ("IFLA_VF_INFO", {"attrs": [attr]})
        self._request(pf, f"{what} on {pf} VF {vf}", RTM_NEWLINK, [("IFLA_VFINFO_LIST", {"attrs": [vfinfo]})], structs)

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._set_vf(pf, vf, f"setting admin MAC {mac}", ("IFLA_VF_MAC", {"vf": vf, "mac": mac}))

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        what = f"setting VLAN {vlan} qos {qos} proto {proto:#06x}"
        if proto == VLAN_PROTO_8021Q:
            # The plain IFLA_VF_VLAN form works on every driver that has VLANs.
            self._set_vf(pf, vf, what, ("IFLA_VF_VLAN", {"vf": vf, "vlan": vlan, "qos": qos}))
        else:
            info = ("IFLA_VF_VLAN_INFO", {"vf": vf, "vlan": vlan, "qos": qos, "proto": proto})
            self._set_vf(pf, vf, what, ("IFLA_VF_VLAN_LIST", {"attrs": [info]}), _VLAN_INFO_SIZED)

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(
            pf, vf, f"setting spoofchk {'on' if on else 'off'}", ("IFLA_VF_SPOOFCHK", {"vf": vf, "spoofchk": int(on)})
        )

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, vf, f"setting trust {'on' if on else 'off'}", ("IFLA_VF_TRUST", {"vf": vf, "trust": int(on)}))

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._set_vf(pf, vf, f"setting link_state {state}", ("IFLA_VF_LINK_STATE", {"vf": vf, "link_state": state}))

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None:
        # IFLA_VF_RATE carries both limits: always send both, or one resets the other.
        rate = {"vf": vf, "min_tx_rate": min_tx_rate, "max_tx_rate": max_tx_rate}
        self._set_vf(pf, vf, f"setting tx rate {min_tx_rate}-{max_tx_rate} Mbps", ("IFLA_VF_RATE", rate))
