"""What the RDMA guest tests share: the node switched to exclusive mode, pod namespaces made there, and back.

The RDMA netns mode can change only while no namespace but the host's
exists, so a test sets exclusive mode before it makes any, and its
teardown deletes them and switches back to shared (the kernel's default,
which the next test expects) once the kernel has finished tearing them down.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sriov_cni.kernel.nlerrors import Busy
from sriov_cni.kernel.rdma import Rdma

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
