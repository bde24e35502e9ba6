"""TEST FIXTURE: builds sriov_rdma_stub (tests/vm/rdmastub/) for the rig's Linux 7.3 guest, and loads it there on chosen VFs.

The module stands in for the RDMA function of a VF on RoCE hardware (mlx5,
irdma, bnxt_re), which no emulated NIC has and rxe cannot imitate (rxe
devices have no PCI parent): each VF named at load gets an mlx5-like RoCE
device (``mlx5_N``) whose parent is the VF's PCI function, bound to the
VF's netdev, movable between namespaces; it moves no data.  See its source.

:func:`build` compiles it on this host against the pinned experimental
kernel (tests/vm/rig.py, ``NEWER_KERNELS``): its linux-headers and
linux-kbuild packages, fetched once through the rig's own apt list (the
machine's apt sources are never touched).  The .ko is cached under the
rig's cache, keyed by the source's hash and the kernel, so a second build
is a no-op.  Build it on the host before booting the guest, where the
tests find it (the guest sees the host's root)::

    python3 -m tests.vm.rdmastub

Why this host's gcc 12 builds a module fit for Debian's gcc-16 kernel: the
guest runs this host's userspace, so a build there would use this same
compiler (only slower, under TCG).  What binds a module to a kernel is the
kernel's configuration and headers (struct layouts), its vermagic and the
symbols it exports (this configuration has no CONFIG_MODVERSIONS, so no
symbol CRCs); kbuild passes the configuration's code model and hardening
flags (-mcmodel=kernel, retpolines and return thunks, call padding, IBT's
-fcf-protection=branch, the stack protector's guard symbol), which gcc 12
implements as gcc 16 does.  What in the configuration names gcc 16 alone
is overridden below (:data:`KBUILD_OVERRIDES`); the headers' gcc-16
attributes (counted_by) only warn.

linux-kbuild's modpost and objtool are sid binaries that need glibc 2.38
(C23's strtol); bookworm has 2.36.  They run under the glibc they were
built for, sid's libc6 unpacked into the cache, through its own dynamic
loader (:func:`_loader_wrappers`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.vm import rig

SOURCE = Path(__file__).resolve().parent / "rdmastub"
MODULE = "sriov_rdma_stub"
KERNEL = rig.NEWER_KERNELS["experimental"]
# sid's, pinned so every build runs the same tools; any glibc from 2.38 on
# runs them.  A pin the archive has dropped fails the download naming it.
LIBC6_VERSION = "2.43-7"
# Bump when build() changes what it makes of the same source.
BUILD_FORMAT = "1"
KBUILD_OVERRIDES = (
    # gcc 14's option; unset, kbuild aligns functions with -falign-functions
    # (to the same CONFIG_FUNCTION_ALIGNMENT), as it does for gcc < 14.
    "CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=",
    # Module BTF needs pahole, which this host lacks; a test module needs no BTF.
    "CONFIG_DEBUG_INFO_BTF_MODULES=",
)
# Tools the build runs from this host: linux-kbuild's makefiles name the
# linker and binutils with Debian's x86_64-linux-gnu- prefix.
HOST_TOOLS = ("gcc", "make", "x86_64-linux-gnu-ld", "apt-get", "dpkg-deb")


class StubBuildError(Exception):
    """The module cannot be built here; the message says what is missing."""


class StubLoadError(Exception):
    """insmod refused the module; the message is insmod's."""


def _series() -> str:
    """``7.3`` of ``7.3-amd64``: the name Debian gives the kernel's common headers and kbuild packages."""
    return KERNEL.release.rsplit("-", 1)[0]


def _header_packages() -> tuple[str, ...]:
    return (f"linux-headers-{KERNEL.release}", f"linux-headers-{_series()}-common", f"linux-kbuild-{_series()}")


def _key() -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in SOURCE.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for part in (KERNEL.release, KERNEL.version, LIBC6_VERSION, BUILD_FORMAT, *KBUILD_OVERRIDES):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _builds() -> Path:
    return rig.cache_dir() / "rdmastub"


def module_path() -> Path:
    """Where the .ko of this source for the pinned kernel is cached."""
    return _builds() / f"{KERNEL.release}-{_key()}" / f"{MODULE}.ko"


def _fetch_all(cache: Path) -> tuple[list[Path], Path]:
    """The header packages and libc6, downloaded once through the rig's apt list of sid and experimental."""
    debs = cache / "debs"
    options = rig._newer_apt(cache)
    wanted = [(p, KERNEL.version) for p in _header_packages()] + [("libc6", LIBC6_VERSION)]
    lists = cache / "apt-newer" / "lists"
    have = all(sorted(debs.glob(f"{p}_{v.replace(':', '%3a')}_*.deb")) for p, v in wanted)
    try:
        if not have and not any(lists.glob("*_Packages*")):
            rig._run(["apt-get", *options, "update", "-q"], "reading sid's and experimental's package lists")
        found = [rig._fetch(p, debs, v, options) for p, v in wanted]
    except rig.RigError as exc:
        raise StubBuildError(
            f"{exc} (pins: the kernel in tests/vm/rig.py NEWER_KERNELS, libc6 in tests/vm/rdmastub.py)"
        ) from exc
    return found[:-1], found[-1]


def _loader_wrappers(dest: Path, kbuild: Path, libc: Path) -> tuple[Path, Path]:
    """modpost and objtool as scripts that run linux-kbuild's binaries under sid's dynamic loader and glibc."""
    loader = libc / "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    # sid's glibc first; libelf and zlib (objtool's) are this host's.
    libraries = f"{libc / 'usr/lib/x86_64-linux-gnu'}:/usr/lib/x86_64-linux-gnu"
    dest.mkdir()
    wrappers = []
    for name, real in (
        ("modpost", kbuild / "scripts/mod/modpost.real-lsb-64"),
        ("objtool", kbuild / "tools/objtool/objtool.real-x86"),
    ):
        for needed in (loader, real):
            if not needed.exists():
                raise StubBuildError(f"no {needed} in the unpacked packages: did the pinned packages change layout?")
        script = dest / name
        script.write_text(f'#!/bin/sh\nexec {shlex.join([str(loader), "--library-path", libraries, str(real)])} "$@"\n')
        script.chmod(0o755)
        wrappers.append(script)
    return wrappers[0], wrappers[1]


def build() -> Path:
    """The module's .ko for the pinned 7.3 kernel, built unless this source's is cached; :class:`StubBuildError` if it cannot be."""
    out = module_path()
    if out.exists():
        return out
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        raise StubBuildError(
            f"building {MODULE} needs {', '.join(missing)} on this host (apt-get install build-essential)"
        )
    cache = rig.cache_dir()
    header_debs, libc_deb = _fetch_all(cache)
    try:
        tree = rig._unpack(header_debs, cache / f"linux-headers-{KERNEL.release}_{KERNEL.version}")
        libc = rig._unpack([libc_deb], cache / libc_deb.stem)
    except rig.RigError as exc:
        raise StubBuildError(str(exc)) from exc
    _builds().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_builds()) as tmp:
        work = Path(tmp)
        # A copy: kbuild writes its objects beside the source.
        src = work / "src"
        shutil.copytree(SOURCE, src)
        modpost, objtool = _loader_wrappers(work / "tools", tree / f"usr/lib/linux-kbuild-{_series()}", libc)
        command = [
            "make",
            "-C",
            str(tree / f"usr/src/linux-headers-{_series()}-common"),
            f"O={tree / f'usr/src/linux-headers-{KERNEL.release}'}",
            f"M={src}",
            "CC=gcc",
            *KBUILD_OVERRIDES,
            f"MODPOST={modpost}",
            f"objtool={objtool}",
            "modules",
        ]
        proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise StubBuildError(f"building {MODULE} failed: {shlex.join(command)}\n{tail}")
        staged = work / "out"
        staged.mkdir()
        shutil.copy2(src / f"{MODULE}.ko", staged / out.name)
        for old in _builds().glob(f"{KERNEL.release}-*"):
            shutil.rmtree(old)
        staged.rename(out.parent)
    return out


def is_loaded() -> bool:
    return Path("/sys/module", MODULE).exists()


@contextmanager
def loaded(ko: Path, vf_pcis: Sequence[str]) -> Iterator[None]:
    """``ko`` loaded for the VFs at ``vf_pcis`` (PCI addresses) in this, the guest's, kernel; unloaded after, unless already."""
    proc = subprocess.run(["insmod", str(ko), f"vfs={','.join(vf_pcis)}"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StubLoadError(f"insmod {ko} vfs={','.join(vf_pcis)}: {proc.stderr.strip()}")
    try:
        yield
    finally:
        if is_loaded():
            unload()


def unload() -> None:
    """rmmod the module: its devices go with it, in a pod's namespace too."""
    subprocess.run(["rmmod", MODULE], check=True, capture_output=True, text=True)


def main() -> int:
    start = time.monotonic()
    try:
        path = build()
    except StubBuildError as exc:
        print(f"rdmastub: {exc}", file=sys.stderr)
        return 2
    print(f"{path} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
