"""The package's build step: the static CNI shim, built by shim/Makefile, goes into every install.

``sriov-cni install-cni`` copies ``sriov_cni/daemon/sriov-shim`` to the node,
so a wheel, ``pip install .`` and ``pip install -e .`` all build it: into the
wheel's tree, or for an editable install where ``make -C shim`` puts it. The
metadata is in pyproject.toml.
"""

from __future__ import annotations

import os
import shlex
import shutil
import struct
import subprocess
import tempfile

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.errors import SetupError

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join("sriov_cni", "daemon", "sriov-shim")
NEEDS = "a C compiler and a static libc (Debian/Ubuntu: apt-get install gcc libc6-dev make)"


def _check_toolchain() -> None:
    """One line naming what to install, instead of make's or the linker's output halfway through a pip log."""
    if shutil.which("make") is None:
        raise SetupError(f"building the sriov-cni shim needs make and {NEEDS}: make is not installed")
    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    if shutil.which(cc[0]) is None:
        raise SetupError(f"building the sriov-cni shim needs {NEEDS}: the compiler {cc[0]!r} (CC) is not installed")
    # The shim is linked statically, so that it runs on any node: a compiler
    # without libc's headers and libc.a (glibc's are in libc6-dev) fails on
    # a program of two lines as it would on the shim, with a clearer answer.
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(
            [*cc, "-static", "-x", "c", "-o", os.path.join(tmp, "probe"), "-"],
            input=b"#include <stdlib.h>\nint main(void) { exit(0); }\n",
            capture_output=True,
        )
    if probe.returncode != 0:
        said = probe.stderr.decode(errors="replace").strip().splitlines()
        raise SetupError(
            f"building the sriov-cni shim needs {NEEDS}: {cc[0]} cannot build a static program"
            + (f" ({said[-1]})" if said else "")
        )


class BuildWithShim(build_py):
    def run(self) -> None:
        super().run()
        _check_toolchain()
        # An editable install runs the tree's package, where install-cni
        # looks; a wheel takes what is in build_lib.
        out = os.path.join(HERE, SHIM) if self.editable_mode else os.path.abspath(os.path.join(self.build_lib, SHIM))
        made = subprocess.run(["make", "-s", "-C", os.path.join(HERE, "shim"), f"OUT={out}"])
        if made.returncode != 0:
            raise SetupError(f"building the sriov-cni shim failed (make -C shim, exit status {made.returncode})")


class WithShim(Distribution):
    """The shim is a program of this platform: the package is installed as platform code, as an extension would be."""

    def has_ext_modules(self) -> bool:
        return True


PT_INTERP = 3
# What a static program needs of a Linux system: its kernel, no libc. The
# shim's glibc says "for GNU/Linux 3.2.0"; manylinux2014 (glibc 2.17,
# CentOS 7's kernel 3.10) and musllinux 1.1 systems all have newer ones.
STATIC_TAGS = ("manylinux_2_17_{arch}", "manylinux2014_{arch}", "musllinux_1_1_{arch}")


def is_static(path: str) -> bool:
    """Whether ELF file ``path`` has no program interpreter: the kernel runs it without the system's ld.so or libc."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF":
            return False
        # e_phoff, then e_phentsize and e_phnum, where ELF64 and ELF32 put them.
        order = "<" if header[5] == 1 else ">"
        offsets = (order + "Q", 32, 54) if header[4] == 2 else (order + "I", 28, 42)
        (phoff,) = struct.unpack_from(offsets[0], header, offsets[1])
        phentsize, phnum = struct.unpack_from(order + "HH", header, offsets[2])
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from(order + "I", table, i * phentsize)[0] != PT_INTERP for i in range(phnum))


class PlatformWheel(bdist_wheel):
    """Tagged for this platform, for any Python 3: the shim links no Python.

    A static shim (the Makefile links it -static) needs no libc of the
    system, so a linux_<arch> wheel is tagged for every manylinux and
    musllinux system of that architecture instead; a shim that is not
    static (a CC that ignores -static) keeps the linux_<arch> tag.
    """

    def get_tag(self) -> tuple[str, str, str]:
        plat = super().get_tag()[2]
        shim = os.path.join(self.get_finalized_command("build_py").build_lib, SHIM)
        if plat.startswith("linux_") and os.path.exists(shim) and is_static(shim):
            arch = plat.removeprefix("linux_")
            plat = ".".join(tag.format(arch=arch) for tag in STATIC_TAGS)
        return ("py3", "none", plat)


setup(distclass=WithShim, cmdclass={"build_py": BuildWithShim, "bdist_wheel": PlatformWheel})
