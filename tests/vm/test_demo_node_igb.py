"""deploy/demo/demo-node.sh as the README tells a user with a real SR-IOV NIC
to run it, in the igb guest: its PF is renamed ens1f0 and stands in for the
real NIC. Real: the kernel (Debian's igb and igbvf drivers on QEMU's
emulated 82576), sysfs, /proc/irq, netlink, the demo's own virtualenv made
by the script for the system's Python, as sudo runs it (Debian's
/usr/bin/python3, which lacks sriov-cni's dependencies). Fixtures: the
emulated NIC and the rename; and PyPI, which the guest cannot reach: root's
pip reads the wheels of the image's pinned requirements, which
deploy/image/build-image.sh --offline downloaded on the host (tests/run.sh
builds the image before it boots the guest).

What the demo may change on the node is read before and after, with ``ip -j``
for the link and sysfs and /proc for the rest, and must be the same: the VF
count, the PF's IRQ affinities, its RPS and XPS masks and flow counts, its
MTU and admin state, and the host's RFS table size. Once to the end, once
interrupted as Ctrl-C interrupts it, while its pods hold VFs.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.requirements import BUILD_REQUIREMENTS, REQUIREMENTS
from tests.docs.commands import DEMO_NODE, Command
from tests.vm.vmlib import SYS_NET

pytestmark = pytest.mark.sriov_vm

REPO = Path(__file__).resolve().parents[2]
NAME = "ens1f0"
# Under TCG: the first run makes the virtualenv and builds the shim; each
# run then boots VFs and pings through them.
DEMO_TIMEOUT = 900.0


def node_state(pf: str) -> dict[str, str]:
    """Each thing the demo may change, as the kernel reports it."""
    [link] = json.loads(subprocess.run(["ip", "-j", "link", "show", "dev", pf], check=True, capture_output=True).stdout)
    net = SYS_NET / pf
    state = {"mtu": str(link["mtu"]), "up": str("UP" in link["flags"])}
    files = [
        net / "device" / "sriov_numvfs",
        Path("/proc/sys/net/core/rps_sock_flow_entries"),
        *sorted(net.glob("queues/rx-*/rps_cpus")),
        *sorted(net.glob("queues/rx-*/rps_flow_cnt")),
        *sorted(net.glob("queues/tx-*/xps_cpus")),
        *(
            Path("/proc/irq") / irq.name / "smp_affinity_list"
            for irq in sorted((net / "device" / "msi_irqs").iterdir())
        ),
    ]
    for f in files:
        try:
            state[str(f)] = f.read_text().strip()
        except OSError as exc:  # a vector without an IRQ (the PF down); xps_cpus of some queues refuses reads
            state[str(f)] = f"unreadable: {exc.strerror}"
    return state


@pytest.fixture
def ens1f0(igb_pfs: list[str], request: pytest.FixtureRequest) -> Iterator[str]:
    """The first igb PF renamed ens1f0. Up (the test's parameter ``"up"``), it has IRQs, one pinned to CPU 0, and
    RPS on its first queue, so that what setup changes differs from what was there; down, it has no IRQs, and
    setup brings it up."""
    pf = igb_pfs[0]
    subprocess.run(["ip", "link", "set", pf, "down"], check=True)
    subprocess.run(["ip", "link", "set", pf, "name", NAME], check=True)
    try:
        if request.param == "up":
            subprocess.run(["ip", "link", "set", NAME, "up"], check=True)
            first_irq = sorted((SYS_NET / NAME / "device" / "msi_irqs").iterdir())[0].name
            (Path("/proc/irq") / first_irq / "smp_affinity_list").write_text("0")
            (SYS_NET / NAME / "queues" / "rx-0" / "rps_cpus").write_text("1")
        yield NAME
    finally:
        (SYS_NET / NAME / "device" / "sriov_numvfs").write_text("0")
        (SYS_NET / NAME / "queues" / "rx-0" / "rps_cpus").write_text("0")
        subprocess.run(["ip", "link", "set", NAME, "down"], check=True)
        subprocess.run(["ip", "link", "set", NAME, "name", pf], check=True)


def image_wheels() -> Path:
    """The directory build-image.sh --offline downloads the pinned wheels to (its cache key: their files' sha256)."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + BUILD_REQUIREMENTS.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sriov-cni-image"
    wheels = cache / f"wheels-{key}"
    if not wheels.is_dir():
        pytest.fail(f"no {wheels}: on the host, run deploy/image/build-image.sh --offline")
    return wheels


@pytest.fixture(scope="module", autouse=True)
def pypi_from_the_image_wheels() -> Iterator[None]:
    """Root's pip, which sudo keeps (it drops PIP_* variables), reads only the image's wheels."""
    conf = Path.home() / ".config" / "pip" / "pip.conf"
    had = conf.read_text() if conf.exists() else None
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"[global]\nno-index = true\nfind-links = {image_wheels()}\n")
    try:
        yield
    finally:
        if had is None:
            conf.unlink()
        else:
            conf.write_text(had)


def start_demo(command: Command) -> subprocess.Popen[str]:
    # In its own session: the interruption below reaches its whole process
    # group, as a terminal's Ctrl-C does.
    return subprocess.Popen(
        ["bash", "-c", command.text],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def read_until(proc: subprocess.Popen[str], marker: str | None) -> str:
    """The demo's output up to the line holding ``marker`` (None: to its end), failing at DEMO_TIMEOUT."""
    assert proc.stdout is not None
    out: list[str] = []
    deadline = time.monotonic() + DEMO_TIMEOUT
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                proc.kill()
                pytest.fail(f"demo still running after {DEMO_TIMEOUT:.0f} s:\n{''.join(out)}")
            line = proc.stdout.readline()
            out.append(line)
            if line == "" or (marker is not None and marker in line):
                return "".join(out)


@pytest.mark.parametrize("ens1f0", ["up"], indirect=True)
def test_the_readmes_demo_node_runs_and_leaves_the_node_as_found(ens1f0: str) -> None:
    before = node_state(ens1f0)
    with start_demo(DEMO_NODE) as proc:
        out = read_until(proc, None)
    assert proc.returncode == 0, out
    assert "demo finished" in out, out
    # Each of the four pods pinged its peer: ping's own summary, 3 of 3.
    assert out.count("3 packets transmitted, 3 received") == 4, out
    assert f"demo: {ens1f0} is back as it was" in out, out
    assert node_state(ens1f0) == before


@pytest.mark.parametrize("ens1f0", ["down"], indirect=True)
def test_the_demo_interrupted_while_pods_hold_vfs_puts_the_node_back(ens1f0: str) -> None:
    before = node_state(ens1f0)
    with start_demo(DEMO_NODE) as proc:
        # Step 4 starts once both pods have their VFs and addresses.
        out = read_until(proc, "== 4.")
        os.killpg(proc.pid, signal.SIGINT)
        out += read_until(proc, None)
    assert proc.returncode == 130, out
    assert f"demo: {ens1f0} is back as it was" in out, out
    assert node_state(ens1f0) == before
    netns = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    assert not {"pod-a", "pod-b"} & {line.split()[0] for line in netns.splitlines() if line.strip()}
