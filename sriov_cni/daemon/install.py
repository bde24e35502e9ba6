"""``sriov-cni install-cni``: the CNI executables written into a node's plugin directory.

Either the static shim for both (shim/sriov-shim.c, built into this package
directory by the package's build, or by ``make -C shim`` in a checkout),
which needs only the daemon on the node, or
scripts that run this installation's Python :mod:`client` and ``sriov-ipam``.
"""

from __future__ import annotations

import os

import sriov_cni
from sriov_cni import safepath

# Built by the package's build (setup.py), or by `make -C shim` in a checkout.
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sriov-shim")
EXECUTABLES = ("sriov", "sriov-ipam")


class ShimNotBuilt(Exception):
    """install() was asked for the shim, but this installation has none."""


def install(dest: str, python: str | None = None) -> list[str]:
    """Write the CNI executables ``sriov`` and ``sriov-ipam`` into ``dest``.

    By default both are the static shim, which needs the daemon and nothing
    else on the node. With ``python`` (an interpreter path valid where they
    will run) they are scripts of this installation instead, which run in
    process when no daemon answers; ``sriov`` starts it with ``-S``:
    site-packages are loaded only when the call runs in process.
    """
    if python is None and not os.path.exists(SHIM):
        raise ShimNotBuilt(
            f"the shim is not built ({SHIM} is missing): run make -C shim in the checkout, or install the package "
            "with pip, whose build compiles it"
        )
    # The directory holding the sriov_cni package, first on the scripts'
    # path so they run this installation's code.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(sriov_cni.__file__)))
    scripts = {
        "sriov": (f"#!{python} -S\n", "sriov_cni.daemon.client"),
        "sriov-ipam": (f"#!{python}\n", "sriov_cni.ipam.main"),
    }
    # The runtime runs what is here as root: a directory others may write
    # would let them swap the executables.
    safepath.state_dir(os.path.abspath(dest), 0o755, "CNI plugin directory")
    written = []
    for name in EXECUTABLES:
        path = os.path.join(dest, name)
        if python is None:
            with open(SHIM, "rb") as f:
                content = f.read()
        else:
            shebang, module = scripts[name]
            content = (
                f"{shebang}import sys\nsys.path.insert(0, {package_root!r})\nfrom {module} import main\nmain()\n"
            ).encode()
        # Replaced, not rewritten: a runtime calling the plugin meanwhile
        # runs the old file or the new, never half of one.
        safepath.replace_file(path, content, 0o755)
        written.append(path)
    return written
