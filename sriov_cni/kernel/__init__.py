"""Talking to the kernel, for the ``sriov`` plugin and the ``sriov-cni`` node command alike.

Netlink (links, addresses, routes, PF-side VF settings; :mod:`netlink` is the
one namespace of names), network namespaces, sysfs, and the CPU sets, IRQ
pins and queue maps that both node setup and the plugin's per-VF hook write.
"""
