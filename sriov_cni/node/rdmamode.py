"""The node's RDMA netns mode: the boot option setup writes, and the running kernel's mode.

The kernel's RDMA core (``ib_core``) has two modes: *shared*, its default,
where every namespace sees every RDMA device, and *exclusive*, where a
device lives in one namespace, so a pod holds its VF's device alone.  The
mode is an ``ib_core`` module option (``netns_mode``) read when the module
loads, and it can be switched at run time only while no network namespace
but the host's exists (EBUSY otherwise): on a node running pods, only the
next boot (or ``ib_core`` reload) brings it.  So setup does both: it writes
the option to a modprobe.d file, and switches the running kernel when the
kernel lets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sriov_cni.kernel import nlerrors, rdma

# Setup's own file.  Shared is the kernel's default, so asking for it
# removes the file rather than writing netns_mode=1: one file, present only
# when it changes something.
OPTION_FILE = "sriov-cni-rdma.conf"
EXCLUSIVE_OPTION = (
    "# sriov-cni setup (node config rdmaNetnsMode: exclusive): each RDMA device lives in one network namespace.\n"
    "options ib_core netns_mode=0\n"
)


class RdmaModes(Protocol):
    """The running kernel's RDMA netns mode."""

    def get(self) -> str | None:
        """``"exclusive"`` or ``"shared"``; None when the kernel has no RDMA core loaded."""
        ...

    def set(self, mode: str) -> None:
        """Switch; raises :class:`~sriov_cni.kernel.nlerrors.Busy` while another network namespace exists."""
        ...


class KernelRdmaModes:
    def get(self) -> str | None:
        try:
            with rdma.Rdma() as host:
                return host.netns_mode()
        except nlerrors.NotSupported:
            # No NETLINK_RDMA: ib_core is not loaded (or not built).
            return None

    def set(self, mode: str) -> None:
        with rdma.Rdma() as host:
            host.set_netns_mode(mode)


def option_path(modprobe_dir: Path) -> Path:
    return modprobe_dir / OPTION_FILE


def boot_option_ok(modprobe_dir: Path, mode: str) -> bool:
    """Whether setup's modprobe.d file already says ``mode`` (exclusive: the option; shared: no file)."""
    path = option_path(modprobe_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return mode == "shared"
    return mode == "exclusive" and text == EXCLUSIVE_OPTION


def write_boot_option(modprobe_dir: Path, mode: str) -> str:
    path = option_path(modprobe_dir)
    if mode == "shared":
        path.unlink(missing_ok=True)
        return f"{path} removed"
    modprobe_dir.mkdir(parents=True, exist_ok=True)
    # Written whole then renamed: a boot that reads a half-written file would
    # load ib_core with an option it cannot parse.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(EXCLUSIVE_OPTION)
    tmp.replace(path)
    return f"{path} written"
