"""The netlink operations the plugin and the node command use, in one namespace of names.

They are implemented by concern, and only the modules that speak netlink
import pyroute2 (for its message classes and attribute tables: the wire
format, which :mod:`sriov_cni.kernel.rtnl` writes and reads from them):

* :mod:`sriov_cni.kernel.rtnl`: requests and their answers on one netlink
  socket (:class:`~sriov_cni.kernel.rtnl.Rtnl`);
* :mod:`sriov_cni.kernel.links`: link, address and route operations inside one
  network namespace (:class:`Namespace`);
* :mod:`sriov_cni.kernel.handles`: the handle per namespace (:func:`open_namespace`) and
  its reuse within a CNI call (:func:`session`);
* :mod:`sriov_cni.kernel.vfcontrol`: PF-side VF settings through the kernel
  (:class:`KernelVfControl`);

and, without pyroute2, :mod:`sriov_cni.kernel.nlerrors` (what a failure means),
:mod:`sriov_cni.kernel.netns` (namespace identity, running code inside one) and
:mod:`sriov_cni.kernel.vfsettings` (the VF settings' values and the
:class:`VfControl` protocol).  Code that needs only those imports them
directly, so parsing a config or choosing a VF does not load pyroute2.
"""

from __future__ import annotations

from sriov_cni.kernel.handles import open_namespace, session
from sriov_cni.kernel.links import LinkInfo, Namespace, riders
from sriov_cni.kernel.netns import is_own_netns, netns_inode, own_netns_path
from sriov_cni.kernel.nlerrors import (
    AddressRefused,
    Busy,
    InvalidArgument,
    LinkExists,
    LinkNotFound,
    NetlinkError,
    NetnsNotFound,
    NotSupported,
)
from sriov_cni.kernel.vfcontrol import KernelVfControl
from sriov_cni.kernel.vfsettings import VLAN_PROTO_8021Q, PfSettings, Rate, VfControl, Vlan

__all__ = [
    "VLAN_PROTO_8021Q",
    "AddressRefused",
    "Busy",
    "InvalidArgument",
    "KernelVfControl",
    "LinkExists",
    "LinkInfo",
    "LinkNotFound",
    "Namespace",
    "NetlinkError",
    "NetnsNotFound",
    "NotSupported",
    "PfSettings",
    "Rate",
    "VfControl",
    "Vlan",
    "is_own_netns",
    "netns_inode",
    "open_namespace",
    "own_netns_path",
    "riders",
    "session",
]
