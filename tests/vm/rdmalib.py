"""What the RDMA guest tests share: the node switched to exclusive mode, pod namespaces made there, and back.

The RDMA netns mode can change only while no namespace but the host's
exists, so a test sets exclusive mode before it makes any, and its
teardown deletes them and switches back to shared (the kernel's default,
which the next test expects) once the kernel has finished tearing them down.
"""

from __future__ import annotations

import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sriov_cni.kernel.nlerrors import Busy
from sriov_cni.kernel.rdma import Rdma
from tests.vm import rig

# The kernel finishes a namespace's teardown (and hands back its RDMA
# devices) from its cleanup work, within about a second; only a fault takes
# this long.
TEARDOWN_BOUND = 60.0


def back_to_shared(namespaces: list[str]) -> None:
    """Delete ``namespaces``, then switch to shared mode once the kernel lets it."""
    for name in namespaces:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    with Rdma() as host:
        # The namespaces' teardown finishes in the kernel's cleanup work:
        # until then the mode cannot change.
        deadline = time.monotonic() + TEARDOWN_BOUND
        while True:
            try:
                host.set_netns_mode("shared")
                return
            except Busy:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@contextmanager
def exclusive_pods(prefix: str) -> Iterator[Callable[[], str]]:
    """Exclusive mode; the callable makes a namespace (``<prefix>N``); at the end they go and the mode is shared again."""
    made: list[str] = []
    with Rdma() as host:
        host.set_netns_mode("exclusive")

    def pod() -> str:
        name = f"{prefix}{len(made)}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        made.append(name)
        return name

    try:
        yield pod
    finally:
        back_to_shared(made)


@contextmanager
def rdma_ucm() -> Iterator[None]:
    """rdma_ucm (/dev/infiniband/rdma_cm, librdmacm's way in) loaded for the block, then unloaded.

    The rig's initramfs holds only the modules it loads at boot; this one
    (and what it needs) comes from the running kernel's package in the rig's
    cache, which the guest sees.
    """
    release = platform.release()
    [kernel] = [k for k in rig.NEWER_KERNELS.values() if k.release == release]
    root = rig.cache_dir() / f"linux-{kernel.release}_{kernel.version}"
    modules = ("rdma_ucm", "rdma_cm", "iw_cm", "ib_cm")
    loaded = [m for m in modules if not Path("/sys/module", m).exists()]
    subprocess.run(["modprobe", "-d", str(root), "-S", release, "rdma_ucm"], check=True)
    try:
        yield
    finally:
        # rmmod, not modprobe -r: that also removes the dependencies left
        # unused, ib_uverbs among them, which the boot loaded and later
        # tests need (their pods then found no device).
        if loaded:
            subprocess.run(["rmmod", *loaded], check=False)
