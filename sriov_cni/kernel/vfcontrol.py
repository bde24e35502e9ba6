"""PF-side VF settings through the kernel: :class:`KernelVfControl`, over netlink."""

from __future__ import annotations

import errno
from typing import Any

from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg as _ifinfmsg

from sriov_cni.kernel.links import translate
from sriov_cni.kernel.nlerrors import LinkNotFound
from sriov_cni.kernel.rtnl import Rtnl, message
from sriov_cni.kernel.vfsettings import VLAN_PROTO_8021Q, PfSettings, Rate, Vlan

# pyroute2 encodes IFLA_VF_VLAN_INFO as 14 bytes, but the kernel's
# struct ifla_vf_vlan_info is 16 (two bytes of tail padding), and kernels
# that validate the nested VLAN list (commit 1aec77b2bb2e, backported to
# stable) reject the short form with EINVAL.  The list form is the only way
# to set an 802.1ad VLAN, so give the struct its real size.  Decoding the
# kernel's 16-byte answers is unaffected.
_IVVI = _ifinfmsg.vflist.vfinfo.vf_vlist.ivvi
if len(_IVVI.fields) == 4:
    _IVVI.fields = _IVVI.fields + (("__pad", "H"),)

RTEXT_FILTER_VF = 1 << 0
# Leaves out each VF's counters (IFLA_VF_STATS), which nothing here reads: with
# many VFs they are a large part of a PF's answer to send and decode.  The
# flag covers VF counters only; kernels older than it ignore it.
RTEXT_FILTER_SKIP_STATS = 1 << 3


def _setting(attrs: Any, name: str, key: str) -> int | None:
    nla = attrs.get_attr(name)
    if nla is None:
        return None
    value = int(nla[key])
    # Drivers that do not implement a setting report it as (u32)-1.
    return None if value == 0xFFFFFFFF else value


def _vf_info(vfinfo: Any) -> tuple[int, PfSettings]:
    mac = vfinfo.get_attr("IFLA_VF_MAC")
    vlan = vfinfo.get_attr("IFLA_VF_VLAN")
    rate = vfinfo.get_attr("IFLA_VF_RATE")
    proto = VLAN_PROTO_8021Q
    vlist = vfinfo.get_attr("IFLA_VF_VLAN_LIST")
    if vlist is not None:
        infos = vlist.get_attrs("IFLA_VF_VLAN_INFO")
        if infos and int(infos[0]["proto"]):
            proto = int(infos[0]["proto"])
    spoofchk = _setting(vfinfo, "IFLA_VF_SPOOFCHK", "spoofchk")
    trust = _setting(vfinfo, "IFLA_VF_TRUST", "trust")
    return int(mac["vf"]), PfSettings(
        vlan=Vlan(int(vlan["vlan"]), int(vlan["qos"]), proto) if vlan is not None else Vlan(0, 0, proto),
        mac=str(mac["mac"]),
        rate=Rate(int(rate["min_tx_rate"]), int(rate["max_tx_rate"])) if rate is not None else Rate(0, 0),
        spoofchk=None if spoofchk is None else bool(spoofchk),
        trust=None if trust is None else bool(trust),
        link_state=_setting(vfinfo, "IFLA_VF_LINK_STATE", "link_state"),
    )


class KernelVfControl:
    """:class:`VfControl` through the kernel, in this process's namespace."""

    def __init__(self) -> None:
        self._rtnl: Rtnl | None = None
        self._indexes: dict[str, int] = {}

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

    def _index(self, pf: str) -> int:
        if pf not in self._indexes:
            msg = message(_ifinfmsg, {}, [("IFLA_IFNAME", pf)])
            try:
                with translate(f"looking up PF {pf}"):
                    found = self._handle().request(RTM_GETLINK, msg)[0]
            except LinkNotFound as exc:
                raise LinkNotFound(f"PF {pf} not found", errno.ENODEV) from exc
            self._indexes[pf] = int(found["index"])
        return self._indexes[pf]

    def vfs(self, pf: str) -> dict[int, PfSettings]:
        index = self._index(pf)
        # Without RTEXT_FILTER_VF the kernel leaves VF info out.
        msg = message(_ifinfmsg, {"index": index}, [("IFLA_EXT_MASK", RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS)])
        with translate(f"reading VFs of {pf}"):
            answer = self._handle().request(RTM_GETLINK, msg)[0]
        vflist = answer.get_attr("IFLA_VFINFO_LIST")
        if vflist is None:
            return {}
        return dict(_vf_info(v) for v in vflist.get_attrs("IFLA_VF_INFO"))

    def _set_vf(self, pf: str, vf: int, what: str, attr: tuple[str, Any]) -> None:
        """One VF setting: ``attr`` nested in IFLA_VFINFO_LIST/IFLA_VF_INFO of the PF."""
        index = self._index(pf)
        vfinfo = ("IFLA_VF_INFO", {"attrs": [attr]})
        msg = message(_ifinfmsg, {"index": index}, [("IFLA_VFINFO_LIST", {"attrs": [vfinfo]})])
        with translate(f"{what} on {pf} VF {vf}"):
            self._handle().request(RTM_NEWLINK, msg)

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._set_vf(pf, vf, f"setting admin MAC {mac}", ("IFLA_VF_MAC", {"vf": vf, "mac": mac}))

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        what = f"setting VLAN {vlan} qos {qos} proto {proto:#06x}"
        if proto == VLAN_PROTO_8021Q:
            # The plain IFLA_VF_VLAN form works on every driver that has VLANs.
            self._set_vf(pf, vf, what, ("IFLA_VF_VLAN", {"vf": vf, "vlan": vlan, "qos": qos}))
        else:
            info = ("IFLA_VF_VLAN_INFO", {"vf": vf, "vlan": vlan, "qos": qos, "proto": proto})
            self._set_vf(pf, vf, what, ("IFLA_VF_VLAN_LIST", {"attrs": [info]}))

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, vf, f"setting spoofchk {'on' if on else 'off'}", ("IFLA_VF_SPOOFCHK", {"vf": vf, "spoofchk": int(on)}))

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, vf, f"setting trust {'on' if on else 'off'}", ("IFLA_VF_TRUST", {"vf": vf, "trust": int(on)}))

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._set_vf(pf, vf, f"setting link_state {state}", ("IFLA_VF_LINK_STATE", {"vf": vf, "link_state": state}))

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None:
        # IFLA_VF_RATE carries both limits: always send both, or one resets the other.
        rate = {"vf": vf, "min_tx_rate": min_tx_rate, "max_tx_rate": max_tx_rate}
        self._set_vf(pf, vf, f"setting tx rate {min_tx_rate}-{max_tx_rate} Mbps", ("IFLA_VF_RATE", rate))
