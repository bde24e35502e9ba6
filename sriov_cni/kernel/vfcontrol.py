"""PF-side VF settings through the kernel: :class:`KernelVfControl`, over netlink."""

from __future__ import annotations

import errno
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg as _ifinfmsg

from sriov_cni.kernel.links import translate
from sriov_cni.kernel.nlerrors import LinkNotFound
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
        self._ipr: Any = None
        self._indexes: dict[str, int] = {}

    def _handle(self) -> Any:
        # One handle for the process, opened on first use: a CNI call
        # makes several VF requests in a row.
        if self._ipr is None:
            self._ipr = IPRoute()
        return self._ipr

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def _index(self, pf: str) -> int:
        if pf not in self._indexes:
            with translate(f"looking up PF {pf}"):
                found = self._handle().link_lookup(ifname=pf)
            if not found:
                raise LinkNotFound(f"PF {pf} not found", errno.ENODEV)
            self._indexes[pf] = int(found[0])
        return self._indexes[pf]

    def vfs(self, pf: str) -> dict[int, PfSettings]:
        index = self._index(pf)
        with translate(f"reading VFs of {pf}"):
            # ext_mask=1 (RTEXT_FILTER_VF): without it the kernel leaves VF info out.
            msg = self._handle().link("get", index=index, ext_mask=1)[0]
        vflist = msg.get_attr("IFLA_VFINFO_LIST")
        if vflist is None:
            return {}
        return dict(_vf_info(v) for v in vflist.get_attrs("IFLA_VF_INFO"))

    def _set_vf(self, pf: str, what: str, spec: dict[str, Any]) -> None:
        index = self._index(pf)
        # pyroute2 consumes the dict it is given; every call builds a fresh one.
        with translate(f"{what} on {pf} VF {spec['vf']}"):
            self._handle().link("set", index=index, vf=spec)

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._set_vf(pf, f"setting admin MAC {mac}", {"vf": vf, "mac": mac})

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        if proto == VLAN_PROTO_8021Q:
            # The plain IFLA_VF_VLAN form works on every driver that has VLANs.
            spec: dict[str, Any] = {"vf": vf, "vlan": {"vlan": vlan, "qos": qos}}
        else:
            spec = {"vf": vf, "vlan": [{"vlan": vlan, "qos": qos, "proto": proto}]}
        self._set_vf(pf, f"setting VLAN {vlan} qos {qos} proto {proto:#06x}", spec)

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, f"setting spoofchk {'on' if on else 'off'}", {"vf": vf, "spoofchk": int(on)})

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._set_vf(pf, f"setting trust {'on' if on else 'off'}", {"vf": vf, "trust": int(on)})

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._set_vf(pf, f"setting link_state {state}", {"vf": vf, "link_state": state})

    def set_rate(self, pf: str, vf: int, min_tx_rate: int, max_tx_rate: int) -> None:
        # IFLA_VF_RATE carries both limits: always send both, or one resets the other.
        spec = {"vf": vf, "rate": {"min_tx_rate": min_tx_rate, "max_tx_rate": max_tx_rate}}
        self._set_vf(pf, f"setting tx rate {min_tx_rate}-{max_tx_rate} Mbps", spec)
