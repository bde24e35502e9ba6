"""Talking to the kernel, for the ``sriov`` plugin and the ``sriov-cni`` node command alike.

Netlink (links, addresses, routes, PF-side VF settings; :mod:`netlink` is the
one namespace of names), network namespaces, sysfs, and the CPU sets, IRQ
pins and queue maps that both node setup and the plugin's per-VF hook write.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType


class _Pyroute2OnDemand(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``pyroute2`` as a package whose ``__init__`` runs only when a name of its own is asked for.

    That ``__init__`` imports every part of the library (NDB, IPDB,
    conntrack, asyncio, nl80211...), about 140 modules, where this package
    uses only the netlink message classes, which import what they need.  It
    was more than half the import time of the in-process executable (1.3 of
    2.5 s in the emulated guest) and doubles the modules a daemon carries.
    A submodule asked for as an attribute (``from pyroute2 import config``,
    as pyroute2's own modules write it) is imported alone; any other name
    (``from pyroute2 import IPRoute``) runs the real ``__init__`` first.
    Nothing happens until something imports pyroute2.
    """

    def __init__(self) -> None:
        self._real: importlib.machinery.ModuleSpec | None = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pyroute2":
            return None
        sys.meta_path.remove(self)
        self._real = importlib.util.find_spec("pyroute2")
        if self._real is None or self._real.loader is None or self._real.submodule_search_locations is None:
            return self._real
        spec = importlib.machinery.ModuleSpec("pyroute2", self, origin=self._real.origin, is_package=True)
        spec.submodule_search_locations = self._real.submodule_search_locations
        spec.has_location = True
        return spec

    def exec_module(self, module: ModuleType) -> None:
        assert self._real is not None and self._real.loader is not None
        loader = self._real.loader
        ran: list[bool] = []

        def attribute(name: str) -> object:
            if not name.startswith("__") and importlib.util.find_spec(f"pyroute2.{name}") is not None:
                return importlib.import_module(f"pyroute2.{name}")
            if ran:
                raise AttributeError(f"module 'pyroute2' has no attribute {name!r}")
            ran.append(True)
            loader.exec_module(module)
            return getattr(module, name)

        module.__getattr__ = attribute  # type: ignore[method-assign]


if "pyroute2" not in sys.modules:
    sys.meta_path.insert(0, _Pyroute2OnDemand())
