#!/usr/bin/env python3
"""Run one command as root inside a QEMU guest that has emulated igb SR-IOV NICs.

The guest boots Debian's current bookworm kernel (the one ``linux-image-amd64``
depends on), or with ``--kernel sid|experimental`` one of the newer kernels
pinned in NEWER_KERNELS, with a busybox initramfs, sees the host's root filesystem
read-only over 9p with a tmpfs overlay on top, and runs the command in a
chroot of it from the same working directory, with the host's Python
interpreter first on PATH and ``SRIOV_CNI_VM=1`` set.  Each PF is a QEMU
``igb`` (Intel 82576, 7 VFs) behind its own PCIe root port.

Usage::

    python3 tests/vm/rig.py [--kernel K] [--pfs N] [--timeout S] [--quiet-limit S] [--memory MB]
                            [--allow-broken-vfs] [--wire [--peer]] -- COMMAND ...

Each PF's port is its own isolated QEMU user-mode network, so traffic between
VFs turns around in the PF's own switch.  With ``--wire`` the PFs' ports are
instead joined by one QEMU hub, an Ethernet segment between them, and every
frame on it is recorded in a pcap file on the results share: the guest reads
it at the path ``$SRIOV_CNI_VM_WIRE`` names (see wirelib.py).  ``--peer`` boots
a second guest beside it, a second node with its own kernel, whose PFs' hub
is joined to the first's by a UDP link on the host's loopback: one segment
for both nodes' PFs.  The second guest runs the commands the first sends it
(wirelib.serve, from ``$SRIOV_CNI_VM_PEER``) until the first's command ends.

The serial console (boot progress and the command's output) is streamed to
stdout; the exit status is the command's.  Anything that cannot be prepared
makes the rig exit with status 2 and one ``rig: ...`` line on stderr.

A watchdog reads the console: when the guest kernel reports a stall (RCU
stall, hung task, soft lockup) or the command prints nothing for
``--quiet-limit`` seconds, the boot is ended and the guest booted once more.
A pytest command then runs only the tests that had not passed (the rig's
plugin, rigplugin.py, reports each test to the host as it ends); any other
command runs again whole.  A second stall fails the run at once, with the
console's last lines.  ``--timeout`` bounds the whole run, boots included.

The rig refuses a guest in which igb VFs cannot come up: ``--memory`` above
IGB_VF_MAX_MEMORY_MB (the VFs' registers then answer nothing), unless
``--allow-broken-vfs`` asks for exactly that.  In the guest it copies to the
console each igbvf "PF still resetting" that a VF logs again after its probe
(its reset handshake with the PF failed: it cannot get a link), and the
watchdog fails the run on the first one, naming the VF.

Importable: :func:`run_in_vm` returns a :class:`VmRun` (exit status, output,
stalls, each test's outcome and time).

The kernel, busybox and the initramfs are cached under ``$SRIOV_CNI_VM_CACHE``
(default ``/var/cache/sriov-cni-vm`` for root, ``~/.cache/sriov-cni-vm``
otherwise); the initramfs is rebuilt whenever the kernel version, the init
script, the module list or INITRAMFS_FORMAT changes.  The newer kernels come
from sid and experimental through an apt list of the rig's own under the
cache (``apt-newer/``): the machine's apt sources and lists are never
touched.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import lzma
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
INIT_SCRIPT = HERE / "init"

# Environment variable set inside the guest; tests/conftest.py gates the
# sriov_vm tests on it.
VM_ENV = "SRIOV_CNI_VM"

# Modules loaded at boot, dependencies first (resolved from modules.dep).
# igbvf must be loaded before VFs are created: the guest has no udev to
# autoload it, and the driver core binds new VFs only to registered drivers.
MODULES = (
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    "overlay",
    "igb",
    "igbvf",
    "veth",
    # DPDK-style bindings of a VF: uio_pci_generic needs no IOMMU; vfio-pci
    # needs the emulated intel-iommu (see qemu_command).
    "uio_pci_generic",
    "vfio_pci",
    "vfio_iommu_type1",
    # What a pod can build on its VF, which DEL must remove before the VF
    # leaves (tests/vm/test_riders_igb.py); the host's kernel has only
    # macvlan, macvtap, vxlan and bridge of these.
    "8021q",
    "macvlan",
    "macvtap",
    "ipvlan",
    "ipvtap",
    "macsec",
    "vxlan",
    "bonding",
    "team",
    "vrf",
    "ip_gre",
    "ipip",
    "sit",
    "ip6_tunnel",
    "bridge",
)

# Loaded in addition on the newer kernels, for the RDMA tests: the verbs core,
# its character devices (/dev/infiniband/uverbsN) and Soft-RoCE.  Debian 12's
# 6.1 has rxe too, but its rxe has no sockets inside a netns, so nothing on
# the bookworm guest uses RDMA.
RDMA_MODULES = ("ib_core", "ib_uverbs", "rdma_rxe")
# Built by Debian from Linux 7.x on: the HSR case of tests/vm/test_riders_igb.py
# runs on the newer kernels.
NEWER_MODULES = (*RDMA_MODULES, "hsr")


@dataclass(frozen=True)
class NewerKernel:
    """A Debian kernel newer than bookworm's, pinned so every run boots the same one.

    Since Linux 7.x Debian splits the kernel into linux-binary (vmlinuz),
    linux-modules (the .ko.xz files) and linux-base (modules.builtin,
    modules.order); linux-image only depends on the three.  A pin the
    archive has dropped (sid and experimental move on) fails the download
    with the pinned version named: move the pin to what the suite has now.
    """

    suite: str
    version: str  # the source package's version, e.g. 7.2.13-1
    release: str  # uname -r, e.g. 7.2.13+deb14-amd64

    def packages(self) -> tuple[str, ...]:
        return tuple(f"linux-{part}-{self.release}" for part in ("binary", "modules", "base"))


# Linux 7.2 runs an rxe device created inside a pod on its VF (shared mode);
# 7.3 is the first whose rxe can move between network namespaces
# (exclusive mode).
NEWER_KERNELS = {
    "sid": NewerKernel("sid", "7.2.13-1", "7.2.13+deb14-amd64"),
    "experimental": NewerKernel("experimental", "7.3~rc7-1~exp1", "7.3-amd64"),
}
KERNEL_CHOICES = ("bookworm", *NEWER_KERNELS)
DEBIAN_ARCHIVE = "http://deb.debian.org/debian"

# Set in the guest of a --wire run to the wire's capture file, and only there.
WIRE_ENV = "SRIOV_CNI_VM_WIRE"
WIRE_CAPTURE = "wire.pcap"
# The QEMU hub the PFs' ports join with --wire.
WIRE_HUB = 0
# Set in the first guest of a --peer run to the second guest's share, seen
# from the first (PEER_SHARE under its own), and only there.
PEER_ENV = "SRIOV_CNI_VM_PEER"
PEER_SHARE = "peer"
# Written into the second guest's share when the first's command has ended.
PEER_STOP = "stop"

# Host environment passed through to the guest command.
PASS_ENV = ("CI", "PYTEST_ADDOPTS", "PYTHONPATH")
PASS_ENV_PREFIX = "SRIOV_CNI_"

# SeaBIOS clears the screen and sets terminal modes; keep the log plain text.
ANSI_ESCAPE = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|c)")
# Bump when _build_initramfs changes what it writes; the key deliberately does
# not hash this whole file, so edits elsewhere in the rig (or two checkouts
# with different rigs) share one cached initramfs.
INITRAMFS_FORMAT = "1"
DEFAULT_PFS = 2
BOOT_ATTEMPTS = 3
# From QEMU's start to init's "running command" line.  A guest boots in about
# a minute under TCG; one that has not started the command by this deadline is
# stuck (multi-threaded TCG wedged a vCPU during boot: the kernel then
# printed RCU stalls until the overall timeout) and is booted again.
BOOT_DEADLINE = 180.0
COMMAND_STARTED = "vm-init: running command"
DEFAULT_TIMEOUT = 600.0
DEFAULT_MEMORY_MB = 2048
# The most guest RAM with which igb VFs come up (2815 MiB measured to work,
# 2816 not).  From 2816 MiB (0xb0000000) on, q35 keeps 2 GiB of RAM below
# 4 GiB and maps the rest above it (pc_q35_init); SeaBIOS then puts the root
# ports' 64-bit prefetchable windows above 4 GiB as well (0xc000000000), and
# the VF BARs, 64-bit prefetchable in igb's SR-IOV capability, go there.
# QEMU 10.0 registers a VF's BARs as 32-bit ones (pcie_sriov_vf_register_bar
# reads the BAR type before igb_pci_realize sets it), so it maps them at the
# low 32 bits of the address the guest gave them ("info pci": "32 bit memory
# at 0x00004000"; VF 0's BAR 0 not at all): every VF register reads 0, the
# VF's reset handshake with the PF fails ("PF still resetting") and the VF
# never gets a link.  QEMU 10.1.2 has the fix ("pcie_sriov: Fix broken MMIO
# accesses from SR-IOV VFs", upstream 2e54e5fda779).
IGB_VF_MAX_MEMORY_MB = 2815
# Lines in which the guest kernel says it is stuck.  Under TCG a vCPU can
# miss its timer interrupts for good: the RCU grace-period kthread reports a
# timer wakeup that never came, tasks then block for minutes, and the guest
# never finishes (it sat at a third of a core until the run's timeout).
STALL_SIGNS = re.compile(
    r"rcu: INFO: \S+ (?:self-)?detected stalls?"
    r"|rcu_\w+ kthread (?:timer wakeup didn't happen|starved)"
    r"|blocked for more than \d+ seconds"
    r"|soft lockup - CPU#\d+ stuck"
    r"|BUG: workqueue lockup"
)
# Longest the running command may leave the console silent.  pytest -v
# prints each test's name as it starts and its outcome as it ends, so this
# bounds one test; a guest whose timers died prints nothing at all, not even
# the kernel's own stall reports.
DEFAULT_QUIET_LIMIT = 600.0
# Where init mounts the results share inside the guest's root.
GUEST_SHARE = "/run/sriov-cni-vm"
PROGRESS_FILE = "progress"
PASSED_FILE = "passed-before"
# How the guest's forwarder (forward_vf_resets) marks the kernel lines it
# copies to the console, as init marks its own.
KMSG_PREFIX = "vm-kmsg: "
# igbvf's words when a VF's reset handshake with its PF fails (igbvf_reset),
# and the ones only igbvf_probe says first when it fails there.
VF_HANDSHAKE_FAILED = re.compile(r"igbvf (\S+): PF still (resetting|in reset state)")
# The line the forwarder copies for a VF that cannot come up.
VF_STUCK = re.compile(rf"{KMSG_PREFIX}\[\s*\d+\.\d+\] igbvf (\S+): PF still resetting")
PCI_DEVICES = Path("/sys/bus/pci/devices")


class RigError(Exception):
    """The guest could not be prepared, booted or did not report back."""


@dataclass(frozen=True)
class Artifacts:
    kernel: Path
    initramfs: Path
    kernel_version: str


def cache_dir() -> Path:
    env = os.environ.get("SRIOV_CNI_VM_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/sriov-cni-vm")
    return Path.home() / ".cache" / "sriov-cni-vm"


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise RigError(f"{what}: {cmd[0]} not found (run tests/setup-host.sh)") from exc
    if proc.returncode != 0:
        detail = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise RigError(f"{what}: {detail}")
    return proc.stdout


def check_qemu() -> None:
    out = _run(["qemu-system-x86_64", "-device", "help"], "checking QEMU")
    if not re.search(r'name "igb"', out):
        raise RigError("qemu-system-x86_64 has no igb device (needs QEMU >= 8; run tests/setup-host.sh)")


def kernel_package() -> str:
    """The versioned kernel package linux-image-amd64 currently depends on."""
    out = _run(
        ["apt-cache", "show", "--no-all-versions", "linux-image-amd64"],
        "resolving linux-image-amd64",
    )
    m = re.search(r"^Depends:.*?\b(linux-image-\d[^\s,(]*-amd64)\b", out, re.M)
    if not m:
        raise RigError("cannot find the kernel package linux-image-amd64 depends on")
    return m.group(1)


def _fetch(package: str, debs: Path, version: str = "*", apt_options: tuple[str, ...] = ()) -> Path:
    """apt-get download ``package`` (at ``version``, if pinned) into ``debs`` unless already there."""
    debs.mkdir(parents=True, exist_ok=True)
    # dpkg names the file with the epoch's colon escaped.
    pattern = f"{package}_{version.replace(':', '%3a')}_*.deb"
    existing = sorted(debs.glob(pattern))
    if existing:
        return existing[-1]
    print(f"rig: downloading {package}", file=sys.stderr, flush=True)
    wanted = package if version == "*" else f"{package}={version}"
    # apt's sandbox user cannot write into a root-owned cache directory.
    _run(
        ["apt-get", *apt_options, "download", "-q", "-o", "APT::Sandbox::User=root", wanted],
        f"downloading {wanted}",
        cwd=debs,
    )
    found = sorted(debs.glob(pattern))
    if not found:
        raise RigError(f"downloading {wanted}: apt-get download produced no .deb")
    return found[-1]


def _unpack(debs: list[Path], dest: Path) -> Path:
    """dpkg-deb -x each of ``debs`` into ``dest`` once; a marker file makes it atomic enough."""
    marker = dest / ".unpacked"
    if not marker.exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for deb in debs:
            _run(["dpkg-deb", "-x", str(deb), str(dest)], f"unpacking {deb.name}")
        marker.write_text("".join(f"{deb.name}\n" for deb in debs))
    return dest


def _newer_apt(cache: Path) -> tuple[str, ...]:
    """apt-get options that read sid and experimental, and nothing else, from a list of the rig's own.

    Its package lists live beside it (read once; again only when a pin is
    not found in them), so the machine's apt state never sees these suites.
    """
    root = cache / "apt-newer"
    lists = root / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    source_list = root / "sources.list"
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    suites = sorted({k.suite for k in NEWER_KERNELS.values()})
    source_list.write_text("".join(f"deb [signed-by={keyring}] {DEBIAN_ARCHIVE} {s} main\n" for s in suites))
    return (
        "-o",
        f"Dir::Etc::SourceList={source_list}",
        # Not the machine's sources.list.d either.
        "-o",
        f"Dir::Etc::SourceParts={root / 'parts.d'}",
        "-o",
        f"Dir::State::Lists={lists}",
    )


def _fetch_newer(kernel: NewerKernel, cache: Path, debs: Path) -> list[Path]:
    """The pinned kernel's three packages, downloaded once."""
    pattern = kernel.version.replace(":", "%3a")
    if all(sorted(debs.glob(f"{p}_{pattern}_*.deb")) for p in kernel.packages()):
        return [_fetch(p, debs, kernel.version) for p in kernel.packages()]
    options = _newer_apt(cache)
    lists = cache / "apt-newer" / "lists"
    if not any(lists.glob("*_Packages*")):
        print(
            f"rig: reading {', '.join(sorted({k.suite for k in NEWER_KERNELS.values()}))} package lists",
            file=sys.stderr,
            flush=True,
        )
        _run(["apt-get", *options, "update", "-q"], "reading the newer kernels' package lists")
    return [_fetch(p, debs, kernel.version, options) for p in kernel.packages()]


def _module_deps(modroot: Path) -> dict[str, list[str]]:
    """modules.dep as {relative .ko path: [dependency paths]}."""
    deps: dict[str, list[str]] = {}
    for line in (modroot / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
    return deps


def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    return re.sub(r"\.ko(\.xz|\.zst|\.gz)?$", "", base).replace("-", "_")


def _builtin(modroot: Path) -> set[str]:
    """The modules built into the kernel (virtio_pci since Debian's 7.x kernels), by name."""
    try:
        return {_module_name(line) for line in (modroot / "modules.builtin").read_text().split()}
    except FileNotFoundError:
        return set()


def _load_order(
    deps: dict[str, list[str]], wanted: tuple[str, ...], builtin: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    by_name = {_module_name(p): p for p in deps}
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        # modules.dep lists the full transitive closure, nearest dependency
        # first; visiting in reverse loads the deepest ones first.
        for dep in reversed(deps[path]):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name in builtin and name not in by_name:
            continue
        if name not in by_name:
            raise RigError(f"kernel has no module {name}")
        visit(by_name[name])
    return order


def _decompress(src: Path) -> bytes:
    data = src.read_bytes()
    if src.name.endswith(".xz"):
        return lzma.decompress(data)
    if src.name.endswith(".gz"):
        return gzip.decompress(data)
    if src.name.endswith(".zst"):
        return subprocess.run(["zstd", "-dc", str(src)], capture_output=True, check=True).stdout
    return data


def _initramfs_key(kver: str, busybox_deb: str, modules: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (kver, busybox_deb, ",".join(modules)):
        h.update(part.encode() + b"\0")
    h.update(INIT_SCRIPT.read_bytes())
    h.update(INITRAMFS_FORMAT.encode())
    return h.hexdigest()[:16]


def _build_initramfs(kroot: Path, kver: str, bbroot: Path, out: Path, modules: tuple[str, ...]) -> None:
    modroot = kroot / "lib/modules" / kver
    if not (modroot / "modules.dep").exists():
        _run(["depmod", "-b", str(kroot), kver], "running depmod on the guest kernel")
    order = _load_order(_module_deps(modroot), modules, _builtin(modroot))

    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        stage = Path(tmp) / "root"
        (stage / "bin").mkdir(parents=True)
        shutil.copy2(bbroot / "bin/busybox", stage / "bin/busybox")
        shutil.copy2(INIT_SCRIPT, stage / "init")
        (stage / "init").chmod(0o755)
        smod = stage / "lib/modules" / kver
        loaded: list[str] = []
        for rel in order:
            # Stored uncompressed: busybox insmod cannot read .ko.zst.
            plain = re.sub(r"\.(xz|zst|gz)$", "", rel)
            dst = smod / plain
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(_decompress(modroot / rel))
            loaded.append(plain)
        for f in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
            if (modroot / f).exists():
                shutil.copy2(modroot / f, smod / f)
        _run(["depmod", "-b", str(stage), kver], "running depmod on the initramfs")
        (stage / "modules.load").write_text("\n".join(loaded) + "\n")

        files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*"))
        cpio = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"],
            input="\n".join(files).encode(),
            cwd=stage,
            capture_output=True,
            check=False,
        )
        if cpio.returncode != 0:
            raise RigError(f"building the initramfs: {cpio.stderr.decode().strip()}")
        partial = out.with_suffix(".part")
        partial.write_bytes(gzip.compress(cpio.stdout, compresslevel=6))
        partial.rename(out)


def prepare(kernel_choice: str = "bookworm") -> Artifacts:
    """Kernel and initramfs for the guest, fetched/built on first use."""
    check_qemu()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    debs = cache / "debs"
    newer = NEWER_KERNELS.get(kernel_choice)
    if newer is None:
        kpkg = kernel_package()
        kver = kpkg.removeprefix("linux-image-")
        kroot = _unpack([_fetch(kpkg, debs)], cache / kpkg)
        kernel = kroot / "boot" / f"vmlinuz-{kver}"
        modules: tuple[str, ...] = MODULES
    else:
        kver = newer.release
        kroot = _unpack(_fetch_newer(newer, cache, debs), cache / f"linux-{kver}_{newer.version}")
        # The split packages install under /usr/lib/modules only; depmod -b
        # (and the initramfs build) read <root>/lib/modules.
        if not (kroot / "lib").exists():
            (kroot / "lib").symlink_to("usr/lib")
        kernel = kroot / "usr/lib/modules" / kver / "vmlinuz"
        kpkg = newer.packages()[0]
        modules = MODULES + NEWER_MODULES
    bb_deb = _fetch("busybox-static", debs)
    bbroot = _unpack([bb_deb], cache / bb_deb.stem)

    if not kernel.exists():
        raise RigError(f"{kpkg} contains no {kernel.name}")
    initramfs = cache / f"initramfs-{kver}-{_initramfs_key(kver, bb_deb.name, modules)}.cpio.gz"
    if not initramfs.exists():
        print(f"rig: building {initramfs.name}", file=sys.stderr, flush=True)
        for old in cache.glob(f"initramfs-{kver}-*.cpio.gz"):
            old.unlink()
        _build_initramfs(kroot, kver, bbroot, initramfs, modules)
    return Artifacts(kernel=kernel, initramfs=initramfs, kernel_version=kver)


def pytest_args_at(command: list[str]) -> int | None:
    """Where pytest's own arguments begin in ``command``; None if it does not run pytest."""
    name = Path(command[0]).name
    if name in ("pytest", "py.test"):
        return 1
    if re.fullmatch(r"python[0-9.]*", name) and command[1:3] == ["-m", "pytest"]:
        return 3
    return None


def _guest_script(
    command: list[str],
    cwd: str,
    share: str,
    rerun: bool,
    watch_vfs: bool = False,
    wire: bool = False,
    peer: bool = False,
) -> str:
    """run.sh for init: the command, from ``cwd``, in a clean environment.

    A pytest command gets the rig's plugin (rigplugin.py), which reports each
    test's progress to ``share``; on a ``rerun`` it also leaves out the tests
    that passed in the stalled boot before.  With ``watch_vfs``,
    forward_vf_resets runs beside the command, on the console alone.  With
    ``wire``, WIRE_ENV names the wire's capture on ``share``; with ``peer``,
    PEER_ENV the second guest's share.
    """
    python_dir = str(Path(sys.executable).parent)
    path = ":".join([python_dir, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
    env = {
        "PATH": path,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
    for key, value in os.environ.items():
        if key in PASS_ENV or key.startswith(PASS_ENV_PREFIX):
            env[key] = value
    # After the pass-through: a host SRIOV_CNI_VM must not override it, nor
    # a host SRIOV_CNI_VM_WIRE give a guest without a wire one.
    env[VM_ENV] = "1"
    env.pop(WIRE_ENV, None)
    env.pop(PEER_ENV, None)
    if wire:
        env[WIRE_ENV] = f"{share}/{WIRE_CAPTURE}"
    if peer:
        env[PEER_ENV] = f"{share}/{PEER_SHARE}"
    at = pytest_args_at(command)
    if at is not None:
        plugin = ["-p", "rigplugin", "--rig-progress", f"{share}/{PROGRESS_FILE}"]
        if rerun:
            plugin += ["--rig-skip", f"{share}/{PASSED_FILE}"]
        command = command[:at] + plugin + command[at:]
        # Last, so the plugin's directory cannot shadow a module of the user's.
        env["PYTHONPATH"] = ":".join(filter(None, (env.get("PYTHONPATH"), str(HERE))))
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
    forwarder = ""
    if watch_vfs:
        program = f"import sys; sys.path.insert(0, {str(HERE)!r}); import rig; rig.forward_vf_resets()"
        # None of the command's output pipe: init's tee would wait for it.
        forwarder = f"{shlex.join([sys.executable, '-c', program])} </dev/null >/dev/console 2>&1 &\n"
    return (
        forwarder + f"cd {shlex.quote(cwd)} || {{ echo 'rig: cannot cd to {cwd} in the guest'; exit 125; }}\n"
        f"exec env -i {assignments} {shlex.join(command)}\n"
    )


# Two vCPUs, so IRQ pinning and RPS masks have more than one CPU to tell
# apart.  They take turns on one host thread (see TCG_THREADS), so the host's
# CPU count does not matter.
GUEST_CPUS = 2
# One host thread runs every vCPU in turn.  With a thread per vCPU
# (thread=multi), a guest on an idle 2-core host once stalled for good: a
# vCPU's timer interrupt never came ("rcu_preempt kthread timer wakeup didn't
# happen ... Possible timer handling issue on cpu=1", then hung tasks).  In
# turns, no vCPU runs on while another waits for its timer.  Measured per boot with
# stress.py --node igb (2 x 120 ops) and the netns-deleted test, twice, on a
# 2-core host shared with 2 or 3 other guests (load 2 to 15), configurations
# booted in turns: thread=single took 185, 209 and 308 s (mean 234 s);
# thread=multi 321, 322 and 362 s (mean 335 s); thread=multi with
# -cpu max,-tsc-deadline 291 and 332 s, with nohz=off 426 s, with -smp 1
# 256 s.  None of those 10 boots stalled: single is kept for its time; that
# it also prevents the stall is likely, not shown (the watchdog catches one).
TCG_THREADS = "single"


def wire_arguments(pfs: int, results: Path, link: tuple[int, int] | None = None) -> list[str]:
    """QEMU's arguments for the wire: each PF's port on one hub, and the capture.

    The capture is a filter on PF 0's port recording both ways: what PF 0
    sends into the hub and what the hub delivers to it.  A hub repeats each
    frame to every port but the one it came in on, so that is every frame
    on the segment, once, in the order QEMU moved them; QEMU writes each
    frame with one write, so a reader sees whole records as they come.

    ``link``, (this guest's UDP port, the other guest's) on 127.0.0.1, puts
    one more port on the hub: a datagram link to the other guest's hub, one
    frame a datagram, so both guests' PFs share the segment.
    """
    ports = [arg for i in range(pfs) for arg in ("-netdev", f"hubport,id=net{i},hubid={WIRE_HUB}")]
    if link is not None:
        ours, theirs = link
        ports += [
            "-netdev",
            f"dgram,id=link,local.type=inet,local.host=127.0.0.1,local.port={ours},"
            f"remote.type=inet,remote.host=127.0.0.1,remote.port={theirs}",
            "-netdev",
            f"hubport,id=uplink,hubid={WIRE_HUB},netdev=link",
        ]
    return [*ports, "-object", f"filter-dump,id=wire,netdev=net0,queue=all,file={results / WIRE_CAPTURE}"]


def qemu_command(
    art: Artifacts,
    results: Path,
    pfs: int,
    memory_mb: int,
    wire: bool = False,
    node: int = 0,
    link: tuple[int, int] | None = None,
) -> list[str]:
    """QEMU's command line for one guest; ``node`` numbers the guests of a
    --peer run (it is in their PFs' MACs, which share one segment)."""
    cmd = [
        "qemu-system-x86_64",
        "-M",
        "q35",
        # An emulated VT-d, so VFs get IOMMU groups and bind to vfio-pci.  The
        # guest runs it in passthrough mode (iommu=pt): virtio-9p does not
        # translate its DMA through the IOMMU, so remapping would break it.
        "-device",
        "intel-iommu,intremap=off",
        "-accel",
        f"tcg,thread={TCG_THREADS}",
        "-cpu",
        "max",
        "-smp",
        str(GUEST_CPUS),
        "-m",
        str(memory_mb),
        "-nographic",
        "-nodefaults",
        "-no-reboot",
        "-serial",
        "stdio",
        "-monitor",
        "none",
        "-kernel",
        str(art.kernel),
        "-initrd",
        str(art.initramfs),
        # pci=realloc: SeaBIOS sizes the root ports' windows for the PF BARs
        # only; the kernel must grow them for the VF BARs or sriov_numvfs fails.
        # no_timer_check: the kernel's early check that the timer ticks
        # through the IO-APIC counts ticks against a busy loop, which a
        # loaded host's TCG loses; 7.3 then panicked at boot ("IO-APIC +
        # timer doesn't work").
        "-append",
        "console=ttyS0 quiet loglevel=4 panic=-1 pci=realloc mitigations=off intel_iommu=on iommu=pt no_timer_check",
        "-fsdev",
        "local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev",
        f"local,id=results,path={results},security_model=passthrough,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=results,mount_tag=results",
    ]
    for i in range(pfs):
        cmd += ["-device", f"pcie-root-port,id=rp{i},bus=pcie.0,chassis={i + 1},addr={i + 0x10:#x}"]
        if not wire:
            cmd += ["-netdev", f"user,id=net{i},restrict=on"]
        cmd += ["-device", f"igb,bus=rp{i},netdev=net{i},mac=52:54:00:5a:{node:02x}:{i + 1:02x}"]
    if wire:
        cmd += wire_arguments(pfs, results, link)
    return cmd


def kmsg_message(record: bytes) -> tuple[float, str]:
    """The time (seconds since boot) and text of one /dev/kmsg record.

    A record is ``priority,sequence,microseconds,flags;text``, then lines
    such as `` SUBSYSTEM=pci`` that name the device.
    """
    head, _, rest = record.decode(errors="replace").partition(";")
    return int(head.split(",")[2]) / 1e6, rest.split("\n", 1)[0]


def _memory_space_on(device: Path) -> bool:
    """Whether a PCI function decodes its memory BARs (COMMAND bit 1); False when it is gone."""
    try:
        config = (device / "config").read_bytes()
    except OSError:
        return False
    return len(config) > 4 and bool(config[4] & 0x2)


def vf_reset_lines(messages: Iterable[tuple[float, str]], devices: Path) -> Iterator[str]:
    """The console lines for the kernel ``messages`` that say a VF cannot come up.

    igbvf says "PF still resetting" whenever a VF's reset handshake with its
    PF fails.  On Debian 12's 6.1 every VF says it once as it probes (after
    "PF still in reset state"): the PF refuses the handshake of a VF that
    has no MAC yet (later kernels take that as success: "igbvf: Regard vf
    reset nack as success").  Healthy VFs say it at no other time: not on
    down and up, MTU or MAC changes, nor in a 120-operation stress run on 14
    VFs.  A VF whose registers do not answer says it again at its first down
    or MTU change.  So each one past the first since the VF's probe is a
    line, unless the VF's memory space is off (a test breaks a VF so, on
    purpose) or the VF is gone; such a VF gives no line until it probes
    again, even once the test has turned its memory space back on.
    """
    since_probe: dict[str, int] = {}
    on_purpose: set[str] = set()
    for seconds, text in messages:
        failed = VF_HANDSHAKE_FAILED.match(text)
        if failed is None:
            continue
        vf, words = failed.groups()
        if words == "in reset state":
            since_probe[vf] = 0
            on_purpose.discard(vf)
            continue
        since_probe[vf] = since_probe.get(vf, 0) + 1
        if since_probe[vf] < 2 or vf in on_purpose:
            continue
        if _memory_space_on(devices / vf):
            yield f"{KMSG_PREFIX}[{seconds:12.6f}] {text}"
        else:
            on_purpose.add(vf)


def _kmsg_messages() -> Iterator[tuple[float, str]]:
    """The kernel's log from its oldest record on, waiting for each new one."""
    fd = os.open("/dev/kmsg", os.O_RDONLY)
    while True:
        try:
            record = os.read(fd, 8192)
        except BrokenPipeError:
            # The kernel's ring overwrote records before they were read; the next read gets the oldest left.
            continue
        yield kmsg_message(record)


def forward_vf_resets() -> None:
    """In the guest: copy the lines of vf_reset_lines to the console, for the watchdog.

    igbvf logs at KERN_INFO, which the console (loglevel=4) leaves out.
    """
    with open("/dev/console", "w") as console:
        for line in vf_reset_lines(_kmsg_messages(), PCI_DEVICES):
            print(line, file=console, flush=True)


class Watchdog:
    """Judges from the console, line by line, whether a guest is stuck.

    ``feed`` takes each console line as it arrives (from the thread reading
    QEMU's output); ``verdict`` says at any moment why the boot should be
    ended, or None while the guest is fine: a VF that cannot come up (see
    vf_reset_lines; ``vf_failure`` then says so too, as booting again would
    not help), a stall reported by the kernel, no "running command" line
    within ``boot_deadline`` of QEMU's start, or a silent console for
    ``quiet_limit`` while the command runs.
    """

    def __init__(self, boot_deadline: float, quiet_limit: float) -> None:
        self.boot_deadline = boot_deadline
        self.quiet_limit = quiet_limit
        self.begun = time.monotonic()
        self.last_line = self.begun
        self.command_started: float | None = None
        self.stall: str | None = None
        self.stuck_vf: str | None = None

    def feed(self, line: str) -> None:
        now = time.monotonic()
        self.last_line = now
        # Not always at the start of a line: SeaBIOS ends its last line without a newline.
        if self.command_started is None and COMMAND_STARTED in line:
            self.command_started = now
        if self.stall is None and STALL_SIGNS.search(line):
            self.stall = line.strip()
        if self.stuck_vf is None and (stuck := VF_STUCK.search(line)):
            self.stuck_vf = stuck.group(1)

    def vf_failure(self) -> str | None:
        if self.stuck_vf is None:
            return None
        return (
            f"igb VF {self.stuck_vf} cannot come up: its reset handshake with the PF failed again after its probe"
            " (igbvf: PF still resetting), so its registers do not answer, as in a guest with more than"
            f" {IGB_VF_MAX_MEMORY_MB} MiB on QEMU before 10.1.2"
        )

    def verdict(self) -> str | None:
        vf_failure = self.vf_failure()
        if vf_failure is not None:
            return vf_failure
        if self.stall is not None:
            return f"the guest kernel reports a stall: {self.stall}"
        now = time.monotonic()
        if self.command_started is None:
            if now - self.begun > self.boot_deadline:
                return f"the guest did not start the command within {self.boot_deadline:.0f} s"
        elif now - self.last_line > self.quiet_limit:
            return f"the guest printed nothing for {self.quiet_limit:.0f} s"
        return None


@dataclass
class Boot:
    """How one boot of the guest ended."""

    status: int | None  # QEMU's exit status; None when the rig killed it
    ended_by: str | None  # the watchdog's verdict, when it ended the boot
    tail: list[str]  # the console's last lines
    boot_seconds: float | None  # from QEMU's start to the command's, if it started
    vf_failure: str | None = None  # the watchdog saw a VF that cannot come up


# How often the rig looks at the watchdog's verdict, in seconds.
WATCH_INTERVAL = 0.25


def _boot(argv: list[str], deadline: float, quiet_limit: float, console: IO[str] | None) -> Boot:
    """One boot of the guest, ended by QEMU or by the watchdog.

    Raises :class:`RigError` when the monotonic ``deadline`` passes first.
    """
    qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watchdog = Watchdog(BOOT_DEADLINE, quiet_limit)
    tail: list[str] = []

    def pump() -> None:
        assert qemu.stdout is not None
        for raw in qemu.stdout:
            line = ANSI_ESCAPE.sub("", raw.decode(errors="replace").replace("\r", ""))
            watchdog.feed(line)
            tail.append(line)
            del tail[:-40]
            if console is not None:
                console.write(line)
                console.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    ended_by = None
    try:
        while True:
            try:
                qemu.wait(timeout=WATCH_INTERVAL)
                break
            except subprocess.TimeoutExpired:
                pass
            ended_by = watchdog.verdict()
            if ended_by is not None or time.monotonic() > deadline:
                qemu.kill()
                qemu.wait()
                if ended_by is None:
                    raise RigError("guest did not finish within the run's timeout; QEMU killed")
                break
    finally:
        reader.join(timeout=5)
        assert qemu.stdout is not None
        qemu.stdout.close()
    started = watchdog.command_started
    return Boot(
        status=None if ended_by is not None else qemu.returncode,
        ended_by=ended_by,
        tail=tail,
        boot_seconds=None if started is None else started - watchdog.begun,
        vf_failure=watchdog.vf_failure(),
    )


@dataclass(frozen=True)
class TestRun:
    """One test in one boot, as the guest's rig plugin reported it."""

    nodeid: str
    boot: int
    outcome: str | None  # None: started but never finished in that boot
    seconds: float


def read_progress(path: Path) -> list[TestRun]:
    """The tests of every boot, in order, from the progress file.

    The rig writes ``boot<TAB>N`` before each boot; the plugin appends the
    lines described in rigplugin.py.
    """
    runs: list[TestRun] = []
    open_: dict[str, int] = {}
    boot = 0
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    for line in lines:
        kind, _, rest = line.partition("\t")
        if kind == "boot":
            boot = int(rest)
        elif kind == "start":
            open_[rest] = len(runs)
            runs.append(TestRun(rest, boot, None, 0.0))
        elif kind == "done":
            outcome, seconds, nodeid = rest.split("\t", 2)
            run = TestRun(nodeid, boot, outcome, float(seconds))
            if nodeid in open_:
                runs[open_.pop(nodeid)] = run
            else:
                runs.append(run)
    return runs


@dataclass
class VmRun:
    """What came of :func:`run_in_vm`."""

    status: int  # the command's exit status (of its last run)
    output: str  # the command's output, of every boot that ran it
    stalls: list[str]  # why each stalled boot was ended (at most one: a second fails the run)
    left_out: int  # tests that passed before a stall and did not run again
    tests: list[TestRun]  # every test of every boot, when the command is pytest
    boot_seconds: list[float]  # per boot that started the command: QEMU's start to the command's


def run_boots(
    command: list[str],
    cwd: str,
    results: Path,
    argv: list[str],
    share: str,
    *,
    timeout: float,
    quiet_limit: float,
    console: IO[str] | None,
    watch_vfs: bool = False,
    wire: bool = False,
    peer: bool = False,
) -> VmRun:
    """Boot ``argv`` (QEMU, with ``results`` shared as ``share`` in the
    guest) until the command has run, and report how it went.

    A boot that fails before init starts the command is retried up to
    BOOT_ATTEMPTS times in all: nothing of the command has run yet.  A boot
    the watchdog ends after the command started is booted once more, and a
    pytest command then runs only the tests that had not passed; a second
    stall raises :class:`RigError` with the console's last lines.  With
    ``watch_vfs`` the guest copies igbvf's failed reset handshakes to the
    console (forward_vf_resets); a VF that cannot come up raises
    :class:`RigError` at once, as every boot would have it.  ``wire`` tells
    the guest's command where the wire's capture is (WIRE_ENV), ``peer``
    where the second guest's share is (PEER_ENV).
    """
    deadline = time.monotonic() + timeout
    progress = results / PROGRESS_FILE
    output_file = results / "output"
    status_file = results / "status"
    stalls: list[str] = []
    outputs: list[str] = []
    boot_seconds: list[float] = []
    left_out = 0
    boots = failed = 0
    while True:
        boots += 1
        (results / "run.sh").write_text(
            _guest_script(command, cwd, share, rerun=bool(stalls), watch_vfs=watch_vfs, wire=wire, peer=peer)
        )
        with progress.open("a") as f:
            f.write(f"boot\t{boots}\n")
        boot = _boot(argv, deadline, quiet_limit, console)
        if boot.vf_failure is not None:
            last = "".join(boot.tail[-15:]).rstrip()
            raise RigError(f"{boot.vf_failure}; a rig failure, not the command's; last console lines:\n{last}")
        if boot.boot_seconds is not None:
            boot_seconds.append(boot.boot_seconds)
        # Init creates the output file as it starts the command: until then
        # nothing of the command has run, and booting again is safe.  QEMU's
        # TCG (multi-threaded, when this was written) now and then aborted on
        # an internal assertion, or wedged, while the firmware or kernel booted.
        crashed = boot.status is None or boot.status < 0
        if crashed and not output_file.exists():
            failed += 1
            if failed < BOOT_ATTEMPTS:
                why = boot.ended_by or f"QEMU status {boot.status}"
                print(f"rig: the guest did not boot ({why}); booting again", file=sys.stderr, flush=True)
                continue
        elif boot.ended_by is not None and not status_file.exists():
            running = [t.nodeid for t in read_progress(progress) if t.boot == boots and t.outcome is None]
            stall = boot.ended_by + (f", during {running[-1]}" if running else "")
            if stalls:
                last = "".join(boot.tail[-30:]).rstrip()
                raise RigError(f"the guest stalled again: {stall}; last console lines:\n{last}")
            stalls.append(stall)
            outputs.append(output_file.read_text(errors="replace"))
            output_file.unlink()
            passed = sorted({t.nodeid for t in read_progress(progress) if t.outcome == "passed"})
            (results / PASSED_FILE).write_text("".join(f"{n}\n" for n in passed))
            if pytest_args_at(command) is not None:
                left_out = len(passed)
                again = f"the tests that had not passed ({left_out} passed ones are left out)"
            else:
                again = "the command again"
            print(f"rig: {stall}; booting once more to run {again}", file=sys.stderr, flush=True)
            continue
        break
    error_file = results / "error"
    if error_file.exists():
        raise RigError(f"guest init failed: {error_file.read_text().strip()}")
    if not status_file.exists():
        last = "".join(boot.tail[-15:]).rstrip()
        why = boot.ended_by or f"QEMU status {boot.status}"
        raise RigError(f"guest stopped ({why}) without reporting a status; last console lines:\n{last}")
    if output_file.exists():
        outputs.append(output_file.read_text(errors="replace"))
    return VmRun(
        status=int(status_file.read_text().strip()),
        output="".join(outputs),
        stalls=stalls,
        left_out=left_out,
        tests=read_progress(progress),
        boot_seconds=boot_seconds,
    )


def check_memory(memory_mb: int, allow_broken_vfs: bool) -> None:
    """Refuse guest memory with which igb VFs cannot come up, unless ``allow_broken_vfs``."""
    if memory_mb > IGB_VF_MAX_MEMORY_MB and not allow_broken_vfs:
        raise RigError(
            f"igb VFs cannot come up with guest memory {memory_mb} MiB, above {IGB_VF_MAX_MEMORY_MB} MiB:"
            " q35 then maps RAM above 4 GiB, the VF BARs go above 4 GiB too, and QEMU before 10.1.2 does not"
            " map them there (igbvf: PF still resetting, no link); give --memory of at most"
            f" {IGB_VF_MAX_MEMORY_MB}, or --allow-broken-vfs for a test that wants VFs that never get a link"
        )


def run_in_vm(
    command: list[str],
    *,
    pfs: int = DEFAULT_PFS,
    timeout: float = DEFAULT_TIMEOUT,
    quiet_limit: float = DEFAULT_QUIET_LIMIT,
    memory_mb: int = DEFAULT_MEMORY_MB,
    allow_broken_vfs: bool = False,
    cwd: str | None = None,
    console: IO[str] | None = None,
    kernel: str = "bookworm",
    wire: bool = False,
    peer: bool = False,
) -> VmRun:
    """Boot the guest, run ``command`` as root in it, power it off.

    Returns the command's exit status, its combined stdout/stderr and how
    the boots went.  The serial console (boot messages plus the same output)
    is copied to ``console`` as it arrives, if given.  Raises
    :class:`RigError` if the guest cannot be prepared, times out, stalls
    twice, or dies without reporting a status; and, unless
    ``allow_broken_vfs``, if its igb VFs cannot come up (check_memory
    before booting, the watchdog after).  With ``wire`` the PFs share one
    Ethernet segment, recorded (wire_arguments); with ``peer`` too, a second
    guest's PFs share it (run_peer).
    """
    if not command:
        raise RigError("no command given")
    if peer and not wire:
        raise RigError("--peer joins a second guest to the wire: give --wire too")
    check_memory(memory_mb, allow_broken_vfs)
    art = prepare(kernel)
    with tempfile.TemporaryDirectory(prefix="sriov-cni-vm-") as tmp:
        results = Path(tmp)
        link = free_udp_ports() if peer else None

        def first() -> VmRun:
            return run_boots(
                command,
                cwd or os.getcwd(),
                results,
                qemu_command(art, results, pfs, memory_mb, wire, link=link),
                GUEST_SHARE,
                timeout=timeout,
                quiet_limit=quiet_limit,
                console=console,
                watch_vfs=not allow_broken_vfs,
                wire=wire,
                peer=peer,
            )

        if link is None:
            return first()
        second = results / PEER_SHARE
        second.mkdir()
        peer_argv = qemu_command(art, second, pfs, memory_mb, wire, node=1, link=(link[1], link[0]))
        return run_peer(first, second, peer_argv, timeout=timeout, quiet_limit=quiet_limit)


def free_udp_ports() -> tuple[int, int]:
    """Two UDP ports free on 127.0.0.1 now, for the guests' link (QEMU binds them moments later)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        first, second = (int(sock.getsockname()[1]) for sock in socks)
        return first, second
    finally:
        for sock in socks:
            sock.close()


# After the first guest's command has ended, how long the second may take to
# see the stop and power off.
PEER_STOP_BOUND = 120.0


def run_peer(
    first: Callable[[], VmRun],
    second: Path,
    argv: list[str],
    *,
    timeout: float,
    quiet_limit: float,
    share: str = GUEST_SHARE,
) -> VmRun:
    """Run the first guest (``first``) while a second, ``argv`` with ``second`` as its share, serves it.

    The second guest starts at once and serves the first's requests from
    its share (``share`` inside it: ``python3 -m tests.vm.wirelib serve``,
    from the repository); once the first guest's run has ended, the rig writes
    PEER_STOP into the second's share and waits for it to power off.  Its
    console goes to ``console`` in its share; a second guest that fails or
    stays up fails the run with its last lines.
    """
    outcome: list[VmRun | RigError] = []
    log = second / "console"

    def serve() -> None:
        with log.open("w") as console:
            try:
                outcome.append(
                    run_boots(
                        [sys.executable, "-m", "tests.vm.wirelib", "serve", share],
                        str(HERE.parent.parent),
                        second,
                        argv,
                        share,
                        timeout=timeout,
                        quiet_limit=quiet_limit,
                        console=console,
                        watch_vfs=True,
                    )
                )
            except RigError as exc:
                outcome.append(exc)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        run = first()
    finally:
        (second / PEER_STOP).touch()
        server.join(PEER_STOP_BOUND)
    last = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:]).rstrip()
    if not outcome:
        raise RigError(f"the second guest did not power off after the first's command; its last lines:\n{last}")
    [served] = outcome
    if isinstance(served, RigError) or served.status != 0:
        why = served if isinstance(served, RigError) else f"status {served.status}"
        raise RigError(f"the second guest failed ({why}); its last lines:\n{last}")
    return run


def module_costs(tests: list[TestRun]) -> list[tuple[str, float, int]]:
    """Per test module: seconds its tests took in every boot, and how many
    finished (a test a stall ended counts with no time); costliest first."""
    costs: dict[str, tuple[float, int]] = {}
    for test in tests:
        module = test.nodeid.split("::", 1)[0]
        seconds, count = costs.get(module, (0.0, 0))
        costs[module] = (seconds + test.seconds, count + (test.outcome is not None))
    return sorted(((m, s, n) for m, (s, n) in costs.items()), key=lambda c: (-c[1], c[0]))


def summary(run: VmRun, seconds: float) -> list[str]:
    """The rig's closing lines for a run that took ``seconds``.

    For a pytest command they say what each test module cost (its tests'
    setup, call and teardown), what the boots cost, and the rest: preparing
    the kernel, pytest's start-up and collection, powering off, and a
    stalled boot's test that never finished.
    """
    lines = [f"rig: guest finished in {seconds:.1f} s, command status {run.status}"]
    if run.tests:
        costs = module_costs(run.tests)
        booting = sum(run.boot_seconds)
        rest = seconds - booting - sum(c[1] for c in costs)
        lines.append("rig: seconds per test module (setup, call and teardown, every boot):")
        lines += [f"rig: {s:8.1f} s  {n:3d} tests  {m}" for m, s, n in costs]
        lines.append(f"rig: {booting:8.1f} s  {len(run.boot_seconds):3d} boots   QEMU's start to the command's")
        lines.append(f"rig: {rest:8.1f} s             the rest (pytest's start-up and collection, power-off)")
    for stall in run.stalls:
        lines.append(f"rig: a boot was ended: {stall}")
        if run.tests:
            lines.append(
                f"rig: a second boot ran the tests that had not passed;"
                f" {run.left_out} that had passed did not run again"
            )
        else:
            lines.append("rig: a second boot ran the command again")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run a command as root in a QEMU guest with emulated igb SR-IOV NICs.",
        usage="%(prog)s [--kernel K] [--pfs N] [--timeout S] [--quiet-limit S] [--memory MB] [--allow-broken-vfs]"
        " [--wire [--peer]] -- COMMAND ...",
    )
    parser.add_argument(
        "--kernel",
        choices=KERNEL_CHOICES,
        default="bookworm",
        help="the guest kernel: bookworm's current one, or the newer one pinned for sid or experimental",
    )
    parser.add_argument("--pfs", type=int, default=DEFAULT_PFS, help="number of igb PFs")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds for the whole run")
    parser.add_argument(
        "--quiet-limit",
        type=float,
        default=DEFAULT_QUIET_LIMIT,
        help="seconds the command may print nothing before the guest counts as stalled",
    )
    parser.add_argument(
        "--memory",
        type=int,
        default=DEFAULT_MEMORY_MB,
        help=f"guest MiB (igb VFs come up with {IGB_VF_MAX_MEMORY_MB} or less)",
    )
    parser.add_argument(
        "--allow-broken-vfs",
        action="store_true",
        help=f"run with --memory above {IGB_VF_MAX_MEMORY_MB}, where igb VFs never get a link, and let VFs stay down",
    )
    parser.add_argument(
        "--wire",
        action="store_true",
        help=f"join the PFs' ports on one Ethernet segment and record it ({WIRE_ENV} names the capture in the guest)",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help=f"with --wire: a second guest, a second node, on the same wire ({PEER_ENV} names its share)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if not 1 <= args.pfs <= 8:
        parser.error("--pfs must be between 1 and 8")
    started = time.monotonic()
    try:
        run = run_in_vm(
            command,
            pfs=args.pfs,
            timeout=args.timeout,
            quiet_limit=args.quiet_limit,
            memory_mb=args.memory,
            allow_broken_vfs=args.allow_broken_vfs,
            console=sys.stdout,
            kernel=args.kernel,
            wire=args.wire,
            peer=args.peer,
        )
    except RigError as exc:
        print(f"rig: {exc}", file=sys.stderr)
        return 2
    print("\n".join(summary(run, time.monotonic() - started)), file=sys.stderr)
    return run.status


if __name__ == "__main__":
    sys.exit(main())
