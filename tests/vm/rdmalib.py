"""What the RDMA guest tests share: the node switched to exclusive mode, pod namespaces made there, and back;
a pod's RoCE v2 GID index, and two pods' RDMA tools run and watched while their packets move.

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

import pytest

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


# Only a fault makes a server miss its port this long, or a tool take this
# long to end once its traffic is done.
BOUND = 240.0
# A transfer's length follows the machine's speed (under TCG on a host at load
# ~170, a 100-message ibv_rc_pingpong once outlasted a 240 s bound), so it is
# not bounded: it is watched, and only no RDMA packet moving on either device
# for this long, a stuck queue pair, fails it.
STALL = 120.0
IB_WRITE_BW_PORT = 18515
PINGPONG_PORT = 18516


# One process for the whole table: rxe's has 1024 entries, and a process
# per entry costs minutes under TCG.  An empty entry's type cannot be read.
GID_SCRIPT = 'cd "/sys/class/infiniband/$1/ports/1" && grep -H . gids/* gid_attrs/types/* 2>/dev/null; true'


def roce_v2_gid_index(pod: str, device: str, address: str) -> int:
    """The GID table index of ``address`` as a RoCE v2 GID (what NCCL_IB_GID_INDEX and perftest's -x take).

    Read inside the pod, as a job would (in exclusive mode only the pod's
    sysfs shows its device).
    """
    octets = [int(o) for o in address.split(".")]
    wanted = "0000:0000:0000:0000:0000:ffff:" + f"{octets[0]:02x}{octets[1]:02x}:{octets[2]:02x}{octets[3]:02x}"
    table = subprocess.run(
        ["ip", "netns", "exec", pod, "sh", "-c", GID_SCRIPT, "gids", device], check=True, capture_output=True, text=True
    ).stdout
    gids: dict[str, str] = {}
    types: dict[str, str] = {}
    for line in table.splitlines():
        path, _, value = line.partition(":")
        where, _, n = path.rpartition("/")
        (gids if where == "gids" else types)[n] = value
    for n, gid in gids.items():
        if gid == wanted and types.get(n) == "RoCE v2":
            return int(n)
    raise AssertionError(f"{device} has no RoCE v2 GID for {address}:\n{table}")


def tcp_listens(pod: str, port: int) -> bool:
    out = subprocess.run(["ip", "netns", "exec", pod, "ss", "-Hltn"], capture_output=True, text=True).stdout
    return f":{port} " in out


def wait_listening(
    pod: str, port: int, server: subprocess.Popen[str], listens: Callable[[str, int], bool] = tcp_listens
) -> None:
    """Until ``server`` listens on ``port`` in ``pod`` (``listens`` says); fails if it ends first or after BOUND."""
    deadline = time.monotonic() + BOUND
    while not listens(pod, port):
        if server.poll() is not None:
            pytest.fail(f"the server in {pod} ended before listening: {server.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"nothing listens on {port} in {pod} within {BOUND:.0f} s")
        time.sleep(0.2)


COUNTERS = "/sys/class/infiniband/{}/ports/1/hw_counters/{}"


def packets(pod: str | None, device: str) -> tuple[int, ...]:
    """rxe's packet counters of ``device``, read in ``pod`` (None: the host).

    In exclusive mode only the pod's sysfs shows its device; in shared mode
    a pod's sysfs shows it without counters (seen on 7.2): the host's has them.
    """
    paths = [COUNTERS.format(device, c) for c in ("sent_pkts", "rcvd_pkts")]
    inside = ["ip", "netns", "exec", pod] if pod is not None else []
    out = subprocess.run([*inside, "cat", *paths], check=True, capture_output=True, text=True)
    return tuple(int(n) for n in out.stdout.split())


def wait_moving(proc: subprocess.Popen[str], ends: list[tuple[str | None, str]], what: str) -> None:
    """Until ``proc`` ends, as long as packets move on the (pod or host, device) ``ends``; fails after STALL without."""
    last: tuple[tuple[int, ...], ...] = ()
    since = time.monotonic()
    while proc.poll() is None:
        now = tuple(packets(pod, device) for pod, device in ends)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > STALL:
            proc.kill()
            pytest.fail(f"{what}: no RDMA packet moved for {STALL:.0f} s ({last}): {proc.communicate()}")
        time.sleep(1.0)


def run_pair(
    pods: list[str],
    counters: list[tuple[str | None, str]],
    server: list[str],
    client: list[str],
    port: int,
    listens: Callable[[str, int], bool] = tcp_listens,
) -> tuple[str, str]:
    """``server`` in pods[0], then ``client`` in pods[1] once the server listens (``listens`` says); both outputs.

    ``counters``: where each pod's device's packet counters are read (see :func:`packets`), and the device.
    """
    with started(["ip", "netns", "exec", pods[0], *server]) as srv:
        wait_listening(pods[0], port, srv, listens)
        cli_out = watched_output(["ip", "netns", "exec", pods[1], *client], counters, client[0])
        return ended_output(srv), cli_out


@contextmanager
def started(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """``argv`` running, its output piped; killed if still running when the block ends."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def ended_output(proc: subprocess.Popen[str]) -> str:
    """What ``proc`` printed, once it has ended (within BOUND) with status 0; else the test fails."""
    out, _ = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, out
    return out


def watched_output(argv: list[str], ends: list[tuple[str | None, str]], what: str) -> str:
    """``argv``'s output once it has ended, watched as long as RDMA packets move on ``ends`` (see wait_moving)."""
    with started(argv) as proc:
        wait_moving(proc, ends, what)
        return ended_output(proc)
