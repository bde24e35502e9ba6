"""``sriov-cni install-cni``: the CNI executables written into a node's plugin directory.

Either the static shim for both (shim/sriov-shim.c, built into this package
directory by the package's build, or by ``make -C shim`` in a checkout),
which needs only the daemon on the node, or
scripts that run this installation's Python :mod:`client` and ``sriov-ipam``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

import sriov_cni
from sriov_cni import safepath

# Built by the package's build (setup.py), or by `make -C shim` in a checkout.
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sriov-shim")
EXECUTABLES = ("sriov", "sriov-ipam")
# A replaced executable not written by sriov-cni is kept under its name
# with this suffix, beside it: the operator can move it back.
BACKUP_SUFFIX = ".orig"

# What marks an executable as one of ours: the shim reads this variable
# (shim/sriov-shim.c), the scripts written here and pip's entry-point
# scripts import from the package.
_OUR_MARKS = (b"SRIOV_CNI_SOCKET", b"from sriov_cni.")
# The reference Go plugin's module path, in every binary built from it.
_REFERENCE_MARK = b"k8snetworkplumbingwg/sriov-cni"


class ShimNotBuilt(Exception):
    """install() was asked for the shim, but this installation has none."""


class MissingDestination(Exception):
    """install() was told not to create ``dest``, and it does not exist."""

    def __init__(self, dest: str, missing: str) -> None:
        super().__init__(f"{dest} does not exist" + ("" if missing == dest else f" ({missing} is missing)"))
        self.dest = dest
        self.missing = missing


@dataclass(frozen=True)
class Replaced:
    """An existing file install() replaced that sriov-cni had not written."""

    path: str
    what: str
    backup: str


def _first_missing(path: str) -> str:
    """The shortest leading part of absolute ``path`` that does not exist."""
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        prefix = "/".join(parts[:i]) or "/"
        if not os.path.lexists(prefix):
            return prefix
    return path


def _describe_foreign(path: str) -> str | None:
    """None when ``path`` is absent or ours; otherwise what it is, for the one line install-cni prints."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"a symlink to {os.readlink(path)}"
    if not stat.S_ISREG(st.st_mode):
        # A directory or a device: the rename over it fails, and says so.
        return None
    found: set[bytes] = set()
    marks = (*_OUR_MARKS, _REFERENCE_MARK)
    overlap = max(len(m) for m in marks)
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(1 << 20):
            window = tail + chunk
            found.update(m for m in marks if m in window)
            tail = window[-overlap:]
    if found & set(_OUR_MARKS):
        return None
    size = f"{st.st_size / 1e6:.1f} MB" if st.st_size >= 100_000 else f"{st.st_size} bytes"
    if _REFERENCE_MARK in found:
        return f"the reference Go sriov-cni plugin, {size}"
    return f"a file sriov-cni did not write, {size}"


def _keep_backup(path: str) -> str:
    """Hard-link ``path`` as ``path + BACKUP_SUFFIX`` (replacing an older backup) and return that name.

    A link, not a rename: ``path`` stays in place until the new file is
    renamed over it, so a runtime calling the plugin meanwhile finds one.
    """
    backup = path + BACKUP_SUFFIX
    tmp = f"{backup}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.link(path, tmp, follow_symlinks=False)
    try:
        os.replace(tmp, backup)
    except BaseException:
        os.unlink(tmp)
        raise
    return backup


def install(
    dest: str,
    python: str | None = None,
    *,
    create_dest: bool = True,
    on_replace: Callable[[Replaced], None] | None = None,
) -> list[str]:
    """Write the CNI executables ``sriov`` and ``sriov-ipam`` into ``dest``.

    By default both are the static shim, which needs the daemon and nothing
    else on the node. With ``python`` (an interpreter path valid where they
    will run) they are scripts of this installation instead, which run in
    process when no daemon answers; ``sriov`` starts it with ``-S``:
    site-packages are loaded only when the call runs in process.

    Without ``create_dest`` a missing ``dest`` raises MissingDestination
    and nothing is created (``sriov-cni install-cni`` asks for that unless
    told --create-dest: a misspelt path should not become a directory).
    An existing file in the way that sriov-cni did not write (the
    reference Go plugin's ``sriov``) is kept as ``<name>.orig`` and
    reported to ``on_replace`` before it is replaced.
    """
    if not create_dest and not os.path.isdir(dest):
        raise MissingDestination(dest, _first_missing(os.path.abspath(dest)))
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
        what = _describe_foreign(path)
        if what is not None:
            replaced = Replaced(path, what, _keep_backup(path))
            if on_replace is not None:
                on_replace(replaced)
        # Replaced, not rewritten: a runtime calling the plugin meanwhile
        # runs the old file or the new, never half of one.
        safepath.replace_file(path, content, 0o755)
        written.append(path)
    return written
