#!/usr/bin/env python3
"""Run one command as root inside a QEMU guest that has emulated igb SR-IOV NICs.

The guest boots Debian's current bookworm kernel (the one ``linux-image-amd64``
depends on) with a busybox initramfs, sees the host's root filesystem
read-only over 9p with a tmpfs overlay on top, and runs the command in a
chroot of it from the same working directory, with the host's Python
interpreter first on PATH and ``SRIOV_CNI_VM=1`` set.  Each PF is a QEMU
``igb`` (Intel 82576, 7 VFs) behind its own PCIe root port.

Usage::

    python3 tests/vm/rig.py [--pfs N] [--timeout S] [--memory MB] -- COMMAND ...

The serial console (boot progress and the command's output) is streamed to
stdout; the exit status is the command's.  Anything that cannot be prepared
makes the rig exit with status 2 and one ``rig: ...`` line on stderr.

Importable: :func:`run_in_vm` returns ``(exit status, output)``.

The kernel, busybox and the initramfs are cached under ``$SRIOV_CNI_VM_CACHE``
(default ``/var/cache/sriov-cni-vm`` for root, ``~/.cache/sriov-cni-vm``
otherwise); the initramfs is rebuilt whenever the kernel version, the init
script, the module list or INITRAMFS_FORMAT changes.
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
import subprocess
import sys
import tempfile
import threading
import time
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
)

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
# stuck (multi-threaded TCG can wedge a vCPU during boot: the kernel then
# prints RCU stalls until the overall timeout) and is booted again.
BOOT_DEADLINE = 180.0
COMMAND_STARTED = "vm-init: running command"
DEFAULT_TIMEOUT = 600.0
DEFAULT_MEMORY_MB = 2048


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
        raise RigError(
            "qemu-system-x86_64 has no igb device (needs QEMU >= 8; run tests/setup-host.sh)"
        )


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


def _fetch(package: str, debs: Path) -> Path:
    """apt-get download ``package`` into ``debs`` unless already there."""
    debs.mkdir(parents=True, exist_ok=True)
    existing = sorted(debs.glob(f"{package}_*.deb"))
    if existing:
        return existing[-1]
    print(f"rig: downloading {package}", file=sys.stderr, flush=True)
    # apt's sandbox user cannot write into a root-owned cache directory.
    _run(
        ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package],
        f"downloading {package}",
        cwd=debs,
    )
    found = sorted(debs.glob(f"{package}_*.deb"))
    if not found:
        raise RigError(f"downloading {package}: apt-get download produced no .deb")
    return found[-1]


def _unpack(deb: Path, dest: Path) -> Path:
    """dpkg-deb -x into ``dest`` once; a marker file makes it atomic enough."""
    marker = dest / ".unpacked"
    if not marker.exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        _run(["dpkg-deb", "-x", str(deb), str(dest)], f"unpacking {deb.name}")
        marker.write_text(deb.name)
    return dest


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


def _load_order(deps: dict[str, list[str]], wanted: tuple[str, ...]) -> list[str]:
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
        return subprocess.run(
            ["zstd", "-dc", str(src)], capture_output=True, check=True
        ).stdout
    return data


def _initramfs_key(kver: str, busybox_deb: str) -> str:
    h = hashlib.sha256()
    for part in (kver, busybox_deb, ",".join(MODULES)):
        h.update(part.encode() + b"\0")
    h.update(INIT_SCRIPT.read_bytes())
    h.update(INITRAMFS_FORMAT.encode())
    return h.hexdigest()[:16]


def _build_initramfs(kroot: Path, kver: str, bbroot: Path, out: Path) -> None:
    modroot = kroot / "lib/modules" / kver
    if not (modroot / "modules.dep").exists():
        _run(["depmod", "-b", str(kroot), kver], "running depmod on the guest kernel")
    order = _load_order(_module_deps(modroot), MODULES)

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

        files = sorted(
            str(p.relative_to(stage)) for p in stage.rglob("*")
        )
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


def prepare() -> Artifacts:
    """Kernel and initramfs for the guest, fetched/built on first use."""
    check_qemu()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    kpkg = kernel_package()
    kver = kpkg.removeprefix("linux-image-")
    debs = cache / "debs"
    kroot = _unpack(_fetch(kpkg, debs), cache / kpkg)
    bb_deb = _fetch("busybox-static", debs)
    bbroot = _unpack(bb_deb, cache / bb_deb.stem)

    kernel = kroot / "boot" / f"vmlinuz-{kver}"
    if not kernel.exists():
        raise RigError(f"{kpkg} contains no {kernel.name}")
    initramfs = cache / f"initramfs-{kver}-{_initramfs_key(kver, bb_deb.name)}.cpio.gz"
    if not initramfs.exists():
        print(f"rig: building {initramfs.name}", file=sys.stderr, flush=True)
        for old in cache.glob(f"initramfs-{kver}-*.cpio.gz"):
            old.unlink()
        _build_initramfs(kroot, kver, bbroot, initramfs)
    return Artifacts(kernel=kernel, initramfs=initramfs, kernel_version=kver)


def _guest_script(command: list[str], cwd: str) -> str:
    python_dir = str(Path(sys.executable).parent)
    path = ":".join(
        [python_dir, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    )
    env = {
        "PATH": path,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }
    for key, value in os.environ.items():
        if key in PASS_ENV or key.startswith(PASS_ENV_PREFIX):
            env[key] = value
    # After the pass-through: a host SRIOV_CNI_VM must not override it.
    env[VM_ENV] = "1"
    assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
    return (
        f"cd {shlex.quote(cwd)} || {{ echo 'rig: cannot cd to {cwd} in the guest'; exit 125; }}\n"
        f"exec env -i {assignments} {shlex.join(command)}\n"
    )


def guest_cpus() -> int:
    """vCPUs for the guest: no more than the host CPUs this process may use.

    Each vCPU is a host thread under multi-threaded TCG; with more vCPUs than
    host CPUs a starved vCPU misses its timer ticks and the guest kernel stalls
    (RCU stall warnings, then no progress at all).
    """
    return max(1, min(4, len(os.sched_getaffinity(0))))


def qemu_command(art: Artifacts, results: Path, pfs: int, memory_mb: int) -> list[str]:
    cmd = [
        "qemu-system-x86_64",
        "-M", "q35",
        # An emulated VT-d, so VFs get IOMMU groups and bind to vfio-pci.  The
        # guest runs it in passthrough mode (iommu=pt): virtio-9p does not
        # translate its DMA through the IOMMU, so remapping would break it.
        "-device", "intel-iommu,intremap=off",
        "-accel", "tcg,thread=multi",
        "-cpu", "max",
        "-smp", str(guest_cpus()),
        "-m", str(memory_mb),
        "-nographic",
        "-nodefaults",
        "-no-reboot",
        "-serial", "stdio",
        "-monitor", "none",
        "-kernel", str(art.kernel),
        "-initrd", str(art.initramfs),
        # pci=realloc: SeaBIOS sizes the root ports' windows for the PF BARs
        # only; the kernel must grow them for the VF BARs or sriov_numvfs fails.
        "-append", "console=ttyS0 quiet loglevel=4 panic=-1 pci=realloc mitigations=off intel_iommu=on iommu=pt",
        "-fsdev", "local,id=hostroot,path=/,security_model=passthrough,readonly=on,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        "-fsdev", f"local,id=results,path={results},security_model=passthrough,multidevs=remap",
        "-device", "virtio-9p-pci,fsdev=results,mount_tag=results",
    ]
    for i in range(pfs):
        cmd += [
            "-device", f"pcie-root-port,id=rp{i},bus=pcie.0,chassis={i + 1},addr={i + 0x10:#x}",
            "-netdev", f"user,id=net{i},restrict=on",
            "-device", f"igb,bus=rp{i},netdev=net{i},mac=52:54:00:5a:00:{i + 1:02x}",
        ]
    return cmd


def _boot(
    art: Artifacts, results: Path, pfs: int, memory_mb: int, timeout: float, console: IO[str] | None
) -> tuple[int, list[str]]:
    """One boot of the guest; QEMU's exit status and the console's last lines."""
    qemu = subprocess.Popen(
        qemu_command(art, results, pfs, memory_mb),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    tail: list[str] = []
    started = threading.Event()

    def pump() -> None:
        assert qemu.stdout is not None
        for raw in qemu.stdout:
            line = ANSI_ESCAPE.sub("", raw.decode(errors="replace").replace("\r", ""))
            # Not always at the start of a line: SeaBIOS ends its last line without a newline.
            if COMMAND_STARTED in line:
                started.set()
            tail.append(line)
            del tail[:-40]
            if console is not None:
                console.write(line)
                console.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    begun = time.monotonic()
    try:
        deadline = begun + min(BOOT_DEADLINE, timeout)
        while not started.wait(1) and qemu.poll() is None:
            if time.monotonic() > deadline:
                print(f"rig: guest did not start the command within {BOOT_DEADLINE:.0f} s", file=sys.stderr, flush=True)
                qemu.kill()
                break
        qemu.wait(timeout=max(0.0, timeout - (time.monotonic() - begun)))
    except subprocess.TimeoutExpired:
        qemu.kill()
        qemu.wait()
        raise RigError(f"guest did not finish within {timeout:.0f} s; QEMU killed") from None
    finally:
        reader.join(timeout=5)
    return qemu.returncode, tail


def run_in_vm(
    command: list[str],
    *,
    pfs: int = DEFAULT_PFS,
    timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int = DEFAULT_MEMORY_MB,
    cwd: str | None = None,
    console: IO[str] | None = None,
) -> tuple[int, str]:
    """Boot the guest, run ``command`` as root in it, power it off.

    Returns the command's exit status and its combined stdout/stderr.  The
    serial console (boot messages plus the same output) is copied to
    ``console`` as it arrives, if given.  Raises :class:`RigError` if the guest
    cannot be prepared, times out, or dies without reporting a status.
    """
    if not command:
        raise RigError("no command given")
    art = prepare()
    with tempfile.TemporaryDirectory(prefix="sriov-cni-vm-") as tmp:
        results = Path(tmp)
        (results / "run.sh").write_text(_guest_script(command, cwd or os.getcwd()))
        for attempt in range(1, BOOT_ATTEMPTS + 1):
            returncode, tail = _boot(art, results, pfs, memory_mb, timeout, console)
            # QEMU's multi-threaded TCG now and then aborts on an internal
            # assertion, or wedges, while the firmware or kernel boots (the
            # wedged boot is killed at BOOT_DEADLINE).  Nothing of the command
            # has run until init creates the output file, so only then is
            # booting again safe.
            if returncode >= 0 or (results / "output").exists() or attempt == BOOT_ATTEMPTS:
                break
            print(f"rig: the guest did not boot (QEMU status {returncode}); booting again", file=sys.stderr, flush=True)
        status_file = results / "status"
        error_file = results / "error"
        if error_file.exists():
            raise RigError(f"guest init failed: {error_file.read_text().strip()}")
        if not status_file.exists():
            last = "".join(tail[-15:]).rstrip()
            raise RigError(
                f"guest stopped (QEMU status {returncode}) without reporting a status;"
                f" last console lines:\n{last}"
            )
        output_file = results / "output"
        output = output_file.read_text(errors="replace") if output_file.exists() else ""
        return int(status_file.read_text().strip()), output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run a command as root in a QEMU guest with emulated igb SR-IOV NICs.",
        usage="%(prog)s [--pfs N] [--timeout S] [--memory MB] -- COMMAND ...",
    )
    parser.add_argument("--pfs", type=int, default=DEFAULT_PFS, help="number of igb PFs")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds")
    parser.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, help="guest MiB")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if not 1 <= args.pfs <= 8:
        parser.error("--pfs must be between 1 and 8")
    started = time.monotonic()
    try:
        status, _ = run_in_vm(
            command, pfs=args.pfs, timeout=args.timeout, memory_mb=args.memory,
            console=sys.stdout,
        )
    except RigError as exc:
        print(f"rig: {exc}", file=sys.stderr)
        return 2
    print(
        f"rig: guest finished in {time.monotonic() - started:.1f} s, command status {status}",
        file=sys.stderr,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
