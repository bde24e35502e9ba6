"""The netlink operations the plugin and the node command use, in one namespace of names.

They are implemented by concern, and only the modules that speak netlink
import pyroute2:

* :mod:`sriov_cni.links`: link, address and route operations inside one
  network namespace (:class:`Namespace`);
* :mod:`sriov_cni.handles`: the handle per namespace (:func:`namespace`) and
  its reuse within a CNI call (:func:`session`);
* :mod:`sriov_cni.vfcontrol`: PF-side VF settings through the kernel
  (:class:`KernelVfControl`);

and, without pyroute2, :mod:`sriov_cni.nlerrors` (what a failure means),
:mod:`sriov_cni.netns` (namespace identity, running code inside one) and
:mod:`sriov_cni.vfsettings` (the VF settings' values and the
:class:`VfControl` protocol).  Code that needs only those imports them
directly, so parsing a config or choosing a VF does not load pyroute2.
"""

from __future__ import annotations

from sriov_cni.handles import namespace, session
from sriov_cni.links import LinkInfo, Namespace
from sriov_cni.netns import is_own_netns, netns_inode, own_netns_path
from sriov_cni.nlerrors import (
    AddressRefused,
    Busy,
    InvalidArgument,
    LinkExists,
    LinkNotFound,
    NetlinkError,
    NetnsNotFound,
    NotSupported,
)
from sriov_cni.vfcontrol import KernelVfControl
from sriov_cni.vfsettings import VLAN_PROTO_8021Q, PfSettings, Rate, VfControl, Vlan

__all__ = [
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
    "VLAN_PROTO_8021Q",
    "VfControl",
    "Vlan",
    "is_own_netns",
    "namespace",
    "netns_inode",
    "own_netns_path",
    "session",
]
