#!/usr/bin/env python3
"""Seeded fault-injection stress run of the ``sriov`` plugin.

A runtime-like driver keeps up to ``--concurrency`` CNI calls in flight
against one VF pool and injects faults while they run.  Between calls and
at the end it checks the product's promises from outside: the kernel's view
of the pods (never the plugin's store) for "no VF in two pods, none left in
a pod it was taken from", every answer for being a CNI result or error
object (never code 999, never a traceback), every store record for being
readable, and, after a final GC with an empty valid-attachments list, every
VF back in the host namespace under its original name, MAC and MTU with its
PF-side settings as at the start, no record and no IPAM address left.

Two nodes:

``host`` (default)
    The host test fixtures: veth ends as VF netdevs in a temporary sysfs,
    with a PF side faked in a file shared by every plugin process.  Plugin
    calls are forked from this (single-threaded) driver with the package
    already imported, and run :func:`sriov_cni.plugin.commands.run` directly.
``igb``
    The QEMU guest's igb PFs and their real VFs.  Plugin calls exec the
    static shim, as on a node, served by ``sriov-cni daemon``; the faults
    include SIGKILLs of the daemon's per-call child and daemon restarts.

Faults: SIGKILL of a call at a random point (a hung call is killed at the
deadline, as a runtime does), the pod's netns deleted before DEL, duplicate
DELs, ADD retried after a failure, a delegated IPAM plugin that fails or
hangs, ENOSPC on the state directory (a small tmpfs holding the store and
the IPAM data), and, on igb, daemon restarts.  GC runs with no other call
in flight, as the spec requires of a runtime.

The seed fixes which operations and faults are chosen and when; with
``--concurrency 1`` it also fixes their order.  The last line of output is
the summary; the exit status is 1 if any invariant was violated.

Usage::

    python3 tests/stress/stress.py --ops 10000 --seed 1
    python3 tests/vm/rig.py -- python3 tests/stress/stress.py --node igb --ops 500 --seed 1
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sriov_cni import log  # noqa: E402
from sriov_cni.kernel import sysfs  # noqa: E402
from sriov_cni.plugin import commands  # noqa: E402
from sriov_cni.vfstore import FileStore  # noqa: E402

DEBIAN_CNI_DIR = "/usr/lib/cni"
NETWORKS = ("stress-a", "stress-b")
TMPFS_SIZE = "8m"
IPAM_HANG_EXTRA = 2.0
# Seconds the daemon may take to give back a lost pod's VF: it sweeps when
# the VF's netdev comes home, and again within seconds after a give-back
# that failed (a full state directory); only a hang or a bug takes this long.
HEAL_BOUND = 120.0
# Faults that entitle a DEL or a CHECK of a live attachment to an error answer
# (a proper CNI error object still; answer_problems checks that part).
EXCUSES = frozenset({"kill", "ipam_fail", "ipam_hang", "enospc", "daemon_restart"})

# The delegated IPAM of network b: sriov-ipam run as an executable, or a
# failure or a hang when the call's CNI_ARGS ask for one.
IPAM_WRAPPER = """#!/bin/sh
case ";$CNI_ARGS;" in
  *";STRESS_IPAM=fail;"*)
    printf '{"cniVersion":"1.0.0","code":11,"msg":"injected IPAM failure"}\\n'
    exit 1 ;;
  *";STRESS_IPAM=hang;"*)
    sleep {hang} ;;
esac
exec {exe} "$@"
"""


# --- what a call answered ----------------------------------------------------------


@dataclass
class Answer:
    rc: int | None  # None: killed before it answered
    stdout: str
    stderr: str

    @property
    def obj(self) -> Any:
        try:
            return json.loads(self.stdout) if self.stdout.strip() else None
        except ValueError:
            return ValueError


def answer_problems(command: str, ans: Answer) -> list[str]:
    """Why ``ans`` is not a well-formed CNI answer (empty: it is)."""
    if ans.rc is None:
        return []
    problems = []
    for stream in (ans.stdout, ans.stderr):
        if "Traceback" in stream:
            # Its last lines name the exception and where it came from.
            tail = " | ".join(stream[stream.index("Traceback") :].strip().splitlines()[-6:])
            problems.append(f"traceback in the output: {tail}")
    obj = ans.obj
    if obj is ValueError:
        problems.append(f"stdout is not JSON: {ans.stdout[:200]!r}")
    elif ans.rc == 0:
        if command == "ADD" and not (isinstance(obj, dict) and obj.get("interfaces")):
            problems.append(f"ADD succeeded without a result: {ans.stdout[:200]!r}")
    elif not (isinstance(obj, dict) and isinstance(obj.get("code"), int) and isinstance(obj.get("msg"), str)):
        problems.append(
            f"failed (status {ans.rc}) without an error object: {ans.stdout[:200]!r}, stderr ends {ans.stderr[-600:]!r}"
        )
    elif obj["code"] == 999:
        problems.append(f"internal error: {obj}")
    return problems


# --- how a call is made -------------------------------------------------------------


@dataclass
class Running:
    pid: int
    out_fd: int
    err_fd: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    popen: subprocess.Popen[bytes] | None = None
    # This call's pipe ends still open here. Their numbers alone do not say
    # it: once closed, a number is reused by the next call's pipe.
    open_fds: set[int] = field(init=False)
    status: int | None = None

    def __post_init__(self) -> None:
        self.open_fds = {self.out_fd, self.err_fd}

    def close_fd(self, fd: int) -> None:
        self.open_fds.discard(fd)
        # A Popen's pipes belong to its file objects; a fork's are ours.
        if self.popen is None:
            os.close(fd)

    def exited(self, block: bool = False) -> bool:
        if self.status is None:
            if self.popen is not None:
                self.status = self.popen.wait() if block else self.popen.poll()
            else:
                pid, raw = os.waitpid(self.pid, 0 if block else os.WNOHANG)
                self.status = os.waitstatus_to_exitcode(raw) if pid else None
        return self.status is not None

    def wait(self) -> int | None:
        """The exit status, or None when a signal ended it."""
        self.exited(block=True)
        if self.popen is not None:
            assert self.popen.stdout is not None and self.popen.stderr is not None
            self.popen.stdout.close()
            self.popen.stderr.close()
        assert self.status is not None
        return None if self.status < 0 else self.status


class Transport(Protocol):
    def start(self, env: dict[str, str], stdin: bytes) -> Running: ...

    def kill_target(self, call: Running) -> int | None: ...

    def restart(self) -> bool: ...

    def close(self) -> None: ...


class ForkTransport:
    """Fork a child of this driver that runs ``commands.run`` with ``deps``."""

    def __init__(self, deps: commands.Deps) -> None:
        self.deps = deps

    def start(self, env: dict[str, str], stdin: bytes) -> Running:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            status = 1
            try:
                # The pipes become the process's own stdout and stderr, as
                # for an executed plugin: logs and delegated IPAM write there.
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for fd in (out_r, err_r, out_w, err_w):
                    os.close(fd)
                sys.stdout = open(1, "w", closefd=False)
                sys.stderr = open(2, "w", closefd=False)
                log.configure_from_env(commands.PROGRAM, env)
                status = commands.run(env, stdin, sys.stdout, sys.stderr, self.deps)
            except BaseException:
                # Escaped the plugin's own handling: a product bug, and the
                # traceback is what the violation report needs.
                traceback.print_exc()
            finally:
                # Nothing may stop the child here: a flush into a pipe the
                # driver already closed raises, and a child that unwinds past
                # this point goes on running the driver's own code.
                for stream in (sys.stdout, sys.stderr):
                    with suppress(BaseException):
                        stream.flush()
                os._exit(status)
        os.close(out_w)
        os.close(err_w)
        return Running(pid, out_r, err_r)

    def kill_target(self, call: Running) -> int | None:
        return call.pid

    def restart(self) -> bool:
        return False

    def close(self) -> None:
        pass


class ExecTransport:
    """Exec a CNI executable; optionally with the daemon behind it."""

    def __init__(self, exe: list[str], daemon: list[str] | None, socket_path: str) -> None:
        from sriov_cni.daemon import client

        self.exe = exe
        self.socket_env = {client.SOCKET_ENV: socket_path}
        self.daemon_cmd = daemon
        self.socket_path = socket_path
        self.daemon: subprocess.Popen[bytes] | None = None
        if daemon:
            self._start_daemon()

    def _start_daemon(self) -> None:
        assert self.daemon_cmd is not None
        # The daemon replaces a leftover socket only once it is ready, so wait
        # for a fresh one rather than for any.
        Path(self.socket_path).unlink(missing_ok=True)
        self.daemon = subprocess.Popen(self.daemon_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.socket_path):
            if time.monotonic() > deadline or self.daemon.poll() is not None:
                raise RuntimeError(f"the daemon did not come up on {self.socket_path}")
            time.sleep(0.05)

    def start(self, env: dict[str, str], stdin: bytes) -> Running:
        proc = subprocess.Popen(
            self.exe,
            env={**env, **self.socket_env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        return Running(proc.pid, proc.stdout.fileno(), proc.stderr.fileno(), popen=proc)

    def kill_target(self, call: Running) -> int | None:
        """The process running the plugin: the daemon's child for this call, if any."""
        if self.daemon is None:
            return call.pid
        # The child serving this call holds the caller's stdout: the same pipe.
        try:
            pipe = os.readlink(f"/proc/{call.pid}/fd/1")
        except OSError:
            return None
        for child in _children(self.daemon.pid):
            try:
                if os.readlink(f"/proc/{child}/fd/1") == pipe:
                    return child
            except OSError:
                continue
        return None

    def restart(self) -> bool:
        if self.daemon is None:
            return False
        self.daemon.kill()
        self.daemon.wait()
        self._start_daemon()
        return True

    def close(self) -> None:
        if self.daemon is not None:
            self.daemon.terminate()
            self.daemon.wait()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


# --- the node --------------------------------------------------------------------


@dataclass(frozen=True)
class NetdevView:
    name: str
    mac: str
    mtu: int


class StressNode(Protocol):
    vf_pcis: list[str]
    cni_path: str

    def pf_side(self) -> dict[str, Any]: ...

    def host_netdevs(self) -> dict[str, NetdevView | None]: ...

    def vfs_in(self, netns: str) -> dict[str, str]: ...

    def delete_netns(self, netns: str) -> None: ...

    def pool_conf(self) -> dict[str, Any]: ...


def ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    cmd = ["ip", "-j"] + (["-n", netns] if netns else []) + list(args)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return []
    parsed: list[dict[str, Any]] = json.loads(proc.stdout or "[]")
    return parsed


class HostNode:
    """PFs with veth "VFs" in a temporary sysfs (tests/support/pluginlib.py)."""

    def __init__(self, work: Path, pfs: int, vfs_per_pf: int) -> None:
        from tests.support.fakes import SharedFakeVfControl
        from tests.support.pluginlib import Node

        self.node = Node(work)
        self.fake = SharedFakeVfControl(work / "pf-side.json")
        self.node.fake = self.fake  # type: ignore[assignment]
        for _ in range(pfs):
            self.node.add_pf(vfs_per_pf, total=vfs_per_pf)
        self.vfs = {vf.pci: vf for pf in self.node.pfs for vf in pf.vfs}
        self.vf_pcis = sorted(self.vfs)
        self.cni_path = DEBIAN_CNI_DIR
        self.deps = commands.Deps(vf_control=lambda: self.fake, store=FileStore, paths=self.node.paths)
        self._peer_to_vf = {f"peer{n}{i}": vf.pci for n, pf in enumerate(self.node.pfs) for i, vf in enumerate(pf.vfs)}

    def pool_conf(self) -> dict[str, Any]:
        return {"pfNames": [pf.name for pf in self.node.pfs]}

    def pf_side(self) -> dict[str, Any]:
        return self.fake.snapshot()

    def host_netdevs(self) -> dict[str, NetdevView | None]:
        out: dict[str, NetdevView | None] = {}
        for pci in self.vf_pcis:
            name = str(self.vfs[pci].netdev)
            entries = ip_json("link", "show", "dev", name)
            out[pci] = NetdevView(name, entries[0]["address"], entries[0]["mtu"]) if entries else None
        return out

    def _peers(self) -> dict[int, str]:
        return {e["ifindex"]: e["ifname"] for e in ip_json("link", "show", netns=self.node.peer_ns)}

    def vfs_in(self, netns: str) -> dict[str, str]:
        """{ifname: VF PCI address} of the VF netdevs in ``netns``, from their veth peers."""
        peers = self._peers()
        out = {}
        for entry in ip_json("link", "show", netns=netns):
            peer = peers.get(entry.get("link_index", -1))
            if entry.get("link_type") == "ether" and peer in self._peer_to_vf:
                out[entry["ifname"]] = self._peer_to_vf[peer]
        return out

    def delete_netns(self, netns: str) -> None:
        """Delete a pod's netns the way a crashed runtime does, and hand its VF back as a kernel would.

        A real VF netdev returns to the host namespace when its namespace
        dies; a veth is destroyed instead.  So the "VF" is recreated in the
        host with the MAC and MTU it had in the pod.  It gets its original
        name back, because the temporary sysfs cannot follow the renames the
        plugin makes; the kernel-chosen name is covered on igb.
        """
        inside = {pci: name for name, pci in self.vfs_in(netns).items()}
        views = {pci: ip_json("link", "show", "dev", name, netns=netns)[0] for pci, name in inside.items()}
        subprocess.run(["ip", "netns", "del", netns], check=True)
        for pci, entry in views.items():
            vf = self.vfs[pci]
            n = self.node.pfs.index(vf.pf)
            peer = f"peer{n}{vf.index}"
            deadline = time.monotonic() + 10
            # Namespace teardown is asynchronous: wait until the pair is gone.
            while peer in self._peers().values():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"veth {peer} outlived its namespace")
                time.sleep(0.02)
            subprocess.run(
                [
                    "ip",
                    "link",
                    "add",
                    str(vf.netdev),
                    "address",
                    entry["address"],
                    "mtu",
                    str(entry["mtu"]),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    peer,
                    "netns",
                    self.node.peer_ns,
                ],
                check=True,
            )

    def close(self) -> None:
        self.node.cleanup()


class IgbNode:
    """The guest's igb PFs with 7 real VFs each."""

    def __init__(self, vfs_per_pf: int) -> None:
        from tests.vm.vmlib import SYS_NET, Sriov, is_sriov_igb, vf_pci_dirs

        self.pfs = sorted(p.name for p in SYS_NET.iterdir() if is_sriov_igb(p))
        if not self.pfs:
            raise RuntimeError("no igb PF found: run this in the QEMU guest (tests/vm/rig.py)")
        self.sriov = Sriov(self.pfs)
        for pf in self.pfs:
            self.sriov.enable(pf, vfs_per_pf)
        self.pf_of = {d.name: pf for pf in self.pfs for d in vf_pci_dirs(pf)}
        self.vf_pcis = sorted(self.pf_of)
        self.cni_path = DEBIAN_CNI_DIR

    def pool_conf(self) -> dict[str, Any]:
        return {"pfNames": list(self.pfs)}

    def pf_side(self) -> dict[str, Any]:
        out = {}
        for pf in self.pfs:
            [entry] = ip_json("-d", "link", "show", "dev", pf)
            out[pf] = entry.get("vfinfo_list", [])
        return out

    def host_netdevs(self) -> dict[str, NetdevView | None]:
        out: dict[str, NetdevView | None] = {}
        for pci in self.vf_pcis:
            net = sysfs.pci_dir(Path("/sys"), pci) / "net"
            names = [p.name for p in net.iterdir()] if net.is_dir() else []
            entries = ip_json("link", "show", "dev", names[0]) if names else []
            out[pci] = NetdevView(names[0], entries[0]["address"], entries[0]["mtu"]) if entries else None
        return out

    def vfs_in(self, netns: str) -> dict[str, str]:
        return {
            e["ifname"]: e["parentdev"]
            for e in ip_json("-d", "link", "show", netns=netns)
            if e.get("parentbus") == "pci" and e.get("parentdev") in self.vf_pcis
        }

    def delete_netns(self, netns: str) -> None:
        subprocess.run(["ip", "netns", "del", netns], check=True)

    def ping(self, src: Attachment, dst: Attachment) -> str | None:
        """None when ``src``'s pod reaches ``dst``'s address, else what went wrong.

        igb switches traffic between the VFs of one PF; a VF not opened
        since it was created takes seconds (under TCG) to report carrier.
        """
        from tests.vm.vmlib import VF_CARRIER_TIMEOUT

        assert src.prev is not None and dst.prev is not None
        address = dst.prev["ips"][0]["address"].split("/")[0]

        def carrier(att: Attachment) -> bool:
            links = ip_json("link", "show", "dev", att.ifname, netns=att.netns_name)
            return bool(links) and "LOWER_UP" in links[0]["flags"]

        deadline = time.monotonic() + VF_CARRIER_TIMEOUT
        while not (carrier(src) and carrier(dst)):
            if time.monotonic() > deadline:
                return f"no carrier within {VF_CARRIER_TIMEOUT:g} s"
            time.sleep(0.1)
        out = subprocess.run(
            ["ip", "netns", "exec", src.netns_name, "ping", "-c", "2", "-i", "0.2", "-W", "5", address],
            capture_output=True,
            text=True,
        )
        return None if out.returncode == 0 else f"{src.container} cannot ping {address}: {out.stdout.strip()}"

    def close(self) -> None:
        self.sriov.restore()


# --- the state directory on a small tmpfs ---------------------------------------------


class StateDir:
    """A tmpfs for the store and IPAM data that can be filled up on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "stress", str(path)], check=True)
        self.filler = path / "filler"
        self.full = False

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # Page-sized writes: tmpfs allocates whole pages, so once one
            # fails no other file can grow either.
            page = b"\0" * 4096
            while True:
                os.write(fd, page)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
        self.full = True

    def drain(self) -> None:
        self.filler.unlink(missing_ok=True)
        self.full = False

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], check=False)


# --- the runtime's view -------------------------------------------------------------


@dataclass
class Attachment:
    container: str
    netns_name: str
    network: str
    ifname: str = "net1"
    state: str = "new"  # new, live, failed, unknown, deleted, retired, lost
    # The VF may be in the pod: after an ADD that succeeded or was killed (its
    # call, or the daemon's child serving it), until a DEL succeeds.
    may_hold: bool = False
    netns_gone: bool = False
    prev: dict[str, Any] | None = None
    mac: str = ""
    pci: str = ""  # the VF that the last successful ADD reported
    history: list[str] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"/var/run/netns/{self.netns_name}"


@dataclass
class Op:
    command: str
    att: Attachment | None
    faults: set[str]
    env: dict[str, str]
    stdin: bytes
    call: Running
    deadline: float
    kill_at: float | None
    killed: bool = False
    # The plugin died mid-call: the call itself, or the daemon's child
    # serving it (whose shim then answers that the call may have partly run).
    cut_short: bool = False


class Driver:
    def __init__(
        self,
        node: StressNode,
        transport: Transport,
        state: StateDir,
        rng: random.Random,
        concurrency: int,
        deadline: float,
        work: Path,
        ipam_exe: Path,
        heals: bool = False,
    ) -> None:
        self.node = node
        self.transport = transport
        self.state = state
        self.rng = rng
        self.concurrency = concurrency
        self.deadline = deadline
        self.token = uuid.uuid4().hex[:5]
        self.data_dir = state.path / "sriov"
        self.ipam_dir = state.path / "ipam"
        self.cni_bin = work / "cni-bin"
        self.cni_bin.mkdir()
        wrapper = self.cni_bin / "stress-ipam"
        wrapper.write_text(
            IPAM_WRAPPER.replace("{hang}", str(deadline + IPAM_HANG_EXTRA)).replace("{exe}", str(ipam_exe))
        )
        wrapper.chmod(0o755)
        self.attachments: list[Attachment] = []
        self.busy: set[str] = set()
        self.running: list[Op] = []
        self.sel = selectors.DefaultSelector()
        self.faults: collections.Counter[str] = collections.Counter()
        self.ops: collections.Counter[str] = collections.Counter()
        self.violations: list[str] = []
        self.started = 0
        self.enospc_left = 0
        self.pings = 0
        # A daemon that gives back the VFs of pods lost without a DEL serves the calls.
        self.heals = heals

    # -- configs

    def conf(self, network: str, mac: str = "", prev: dict[str, Any] | None = None) -> dict[str, Any]:
        ipam: dict[str, Any]
        if network == NETWORKS[0]:
            # In-process IPAM and PF-side settings for the restore to undo.
            ipam = {"type": "sriov-ipam", "dataDir": str(self.ipam_dir), "ranges": [[{"subnet": "10.60.0.0/24"}]]}
            extra: dict[str, Any] = {"vlan": 100, "vlanQoS": 2, "spoofchk": "off", "trust": "on"}
        else:
            ipam = {"type": "stress-ipam", "dataDir": str(self.ipam_dir), "ranges": [[{"subnet": "10.61.0.0/24"}]]}
            extra = {}
        out: dict[str, Any] = {
            "cniVersion": "1.1.0",
            "name": network,
            "type": "sriov",
            "dataDir": str(self.data_dir),
            "ipam": ipam,
            **self.node.pool_conf(),
            **extra,
        }
        if mac:
            out["runtimeConfig"] = {"mac": mac}
        if prev is not None:
            out["prevResult"] = prev
        return out

    def env(self, command: str, att: Attachment | None, ipam_fault: str = "") -> dict[str, str]:
        args = "IgnoreUnknown=1" + (f";STRESS_IPAM={ipam_fault}" if ipam_fault else "")
        return {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": att.container if att else "",
            "CNI_NETNS": (att.netns if not att.netns_gone or self.rng.random() < 0.5 else "") if att else "",
            "CNI_IFNAME": att.ifname if att else "",
            "CNI_ARGS": args,
            "CNI_PATH": f"{self.cni_bin}:{self.node.cni_path}",
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }

    # -- choosing the next operation

    def new_attachment(self) -> Attachment:
        n = len(self.attachments)
        att = Attachment(f"stress-{self.token}-{n}", f"stress-{self.token}-{n}", self.rng.choice(NETWORKS))
        subprocess.run(["ip", "netns", "add", att.netns_name], check=True)
        if self.rng.random() < 0.5:
            att.mac = "02:5e:" + ":".join(f"{self.rng.randrange(256):02x}" for _ in range(4))
        self.attachments.append(att)
        return att

    def choose(self) -> tuple[str, Attachment | None]:
        r = self.rng.random()
        if r < 0.03:
            return "GC", None
        if r < 0.06:
            return "STATUS", None
        active = [a for a in self.attachments if a.state not in ("retired", "lost") and a.container not in self.busy]
        if len(active) < 2 * len(self.node.vf_pcis) and self.rng.random() < 0.35:
            return "ADD", self.new_attachment()
        if not active:
            return "ADD", self.new_attachment()
        att = self.rng.choice(active)
        if att.state == "new":
            return "ADD", att
        if att.netns_gone and att.state != "deleted":
            # Nothing but DEL makes sense once the pod's netns is gone (and,
            # once DELeted, the pod is retired below like any other).
            return "DEL", att
        if att.state == "live":
            if self.heals and self.rng.random() < 0.08:
                self.lose(att)
                return "STATUS", None
            return self.rng.choices(["CHECK", "DEL", "ADD"], [3, 2, 0.2])[0], att
        if att.state in ("failed", "unknown"):
            # What a runtime does after a failed or timed-out ADD: DEL it, or retry.
            if self.rng.random() < 0.4:
                self.faults["add_retry"] += 1
                return "ADD", att
            return "DEL", att
        # deleted: a duplicate DEL now and then, otherwise the pod is gone.
        if self.rng.random() < 0.3:
            self.faults["duplicate_del"] += 1
            return "DEL", att
        self.retire(att)
        return "STATUS", None

    def lose(self, att: Attachment) -> None:
        """The runtime loses the pod: its netns goes and no DEL ever comes (the daemon gives its VF back)."""
        self.node.delete_netns(att.netns_name)
        att.netns_gone = True
        att.state = "lost"
        self.faults["pod_lost"] += 1

    def check_healed(self) -> None:
        """Every lost pod's VF given back without a DEL or GC, within HEAL_BOUND seconds."""
        lost = {a.container for a in self.attachments if a.state == "lost"}
        deadline = time.monotonic() + HEAL_BOUND
        while True:
            store = FileStore(self.data_dir)
            left = (
                sorted(a.container_id for a in store.all() if a.container_id in lost) if store.vfs_dir.is_dir() else []
            )
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for container in left:
            self.violate(f"the VF of lost pod {container} was not given back without a DEL")
        # Their addresses too, before the final GC's IPAM GC could release them.
        for network in NETWORKS:
            for owner in _owners(self.ipam_dir / network):
                if owner in lost:
                    self.violate(f"IPAM of {network} still holds an address of lost pod {owner}")

    def retire(self, att: Attachment) -> None:
        """The runtime removes the pod: its netns goes, and no VF may be left in it."""
        if not att.netns_gone:
            left = self.node.vfs_in(att.netns_name)
            if left:
                self.violate(f"DELeted pod {att.container} still holds {left}")
            self.node.delete_netns(att.netns_name)
            att.netns_gone = True
        att.state = "retired"

    def valid_attachments(self) -> list[dict[str, str]]:
        return [
            {"containerID": a.container, "ifname": a.ifname}
            for a in self.attachments
            if a.state not in ("deleted", "retired", "lost")
        ]

    # -- running

    def launch(self) -> None:
        command, att = self.choose()
        if command == "GC":
            # The spec has the runtime run GC alone: an ADD that starts after
            # GC took its list would otherwise lose its IPAM reservation to it.
            self.drain()
        faults: set[str] = set()
        network = att.network if att else self.rng.choice(NETWORKS)
        if (
            att is not None
            and command == "DEL"
            and att.state == "live"
            and not att.netns_gone
            and self.rng.random() < 0.15
        ):
            self.node.delete_netns(att.netns_name)
            att.netns_gone = True
            faults.add("netns_deleted")
        ipam_fault = ""
        if network == NETWORKS[1] and command in ("ADD", "DEL", "CHECK") and self.rng.random() < 0.04:
            ipam_fault = self.rng.choice(["fail", "hang"])
            faults.add(f"ipam_{ipam_fault}")
        if self.state.full:
            faults.add("enospc")
        conf = self.conf(network, att.mac if att else "", att.prev if att and command == "CHECK" else None)
        if command == "GC":
            conf["cni.dev/valid-attachments"] = self.valid_attachments()
        kill_at = None
        if self.rng.random() < 0.08:
            kill_at = time.monotonic() + self.rng.uniform(0.0, 0.4)
            faults.add("kill")
        if self.rng.random() < 0.005 and self.transport.restart():
            self.faults["daemon_restart"] += 1
            # Calls in flight lose their daemon child, or their IPAM call
            # finds no socket for a moment: an error answer is their due.
            for op in self.running:
                op.faults.add("daemon_restart")
                op.cut_short = True
        self.submit(command, att, conf, self.env(command, att, ipam_fault), faults, kill_at, self.deadline)
        if command == "GC":
            self.drain()
        self.ops[command] += 1
        self.started += 1
        for fault in faults - {"kill"}:
            self.faults[fault] += 1

    def submit(
        self,
        command: str,
        att: Attachment | None,
        conf: dict[str, Any],
        env: dict[str, str],
        faults: set[str],
        kill_at: float | None,
        deadline: float,
    ) -> Op:
        stdin = json.dumps(conf).encode()
        call = self.transport.start(env, stdin)
        op = Op(command, att, faults, env, stdin, call, time.monotonic() + deadline, kill_at)
        self.sel.register(call.out_fd, selectors.EVENT_READ, (op, call.out))
        self.sel.register(call.err_fd, selectors.EVENT_READ, (op, call.err))
        self.running.append(op)
        if att is not None:
            self.busy.add(att.container)
        return op

    def pump(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout):
            op, buf = key.data
            chunk = os.read(key.fd, 65536)
            if chunk:
                buf.extend(chunk)
            else:
                self.sel.unregister(key.fd)
                op.call.close_fd(key.fd)
        now = time.monotonic()
        for op in list(self.running):
            if op.kill_at is not None and now >= op.kill_at:
                target = self.transport.kill_target(op.call)
                op.kill_at = None
                if target is not None:
                    self.faults["kill"] += 1
                    self.kill(op, target)
            if now >= op.deadline:
                # A runtime gives up on a hung plugin and kills it.
                self.faults["deadline_kill"] += 1
                self.kill(op, op.call.pid)
            self.reap(op)

    def kill(self, op: Op, pid: int) -> None:
        _kill(pid)
        op.deadline = float("inf")
        # Only the call's own process dying leaves it without an answer; a
        # killed daemon child is something the executable must report.
        op.killed = op.killed or pid == op.call.pid
        op.cut_short = True

    def reap(self, op: Op) -> None:
        # By the call's own record: judged by the selector's map, a number
        # this call closed (at its stdout's EOF, while an orphan of it held
        # its stderr) and the next call reused would be closed under that
        # call, which then died writing its answer (EPIPE).
        pending = sorted(op.call.open_fds)
        if pending and op.killed and op.call.exited():
            # An orphaned IPAM child may keep the pipes open for a while.
            for fd in pending:
                self.sel.unregister(fd)
                op.call.close_fd(fd)
        elif pending:
            return
        rc = op.call.wait()
        self.running.remove(op)
        if op.att is not None:
            self.busy.discard(op.att.container)
        ans = Answer(rc, op.call.out.decode(errors="replace"), op.call.err.decode(errors="replace"))
        if op.att is not None:
            code = ans.obj.get("code") if isinstance(ans.obj, dict) else None
            op.att.history.append(f"{op.command}{sorted(op.faults)}->{ans.rc}/{code}")
        for problem in answer_problems(op.command, ans):
            self.violate(f"{op.command} {op.att.container if op.att else ''} {sorted(op.faults)}: {problem}")
        self.account(op, ans)
        self.check_store()

    def account(self, op: Op, ans: Answer) -> None:
        att = op.att
        ok = ans.rc == 0
        if att is None:
            return
        if op.command == "ADD":
            if ok:
                att.state, att.may_hold, att.prev = "live", True, ans.obj
                att.pci = next((i.get("pciID", "") for i in ans.obj["interfaces"] if i.get("sandbox")), "")
            elif ans.rc is None or ans.obj is ValueError or op.cut_short:
                # The plugin died mid-call, perhaps after moving the VF in:
                # only a DEL can tell (the shim says the call may have
                # partly run).
                att.state, att.may_hold = "unknown", True
            elif att.state == "new":
                att.state = "failed"
        elif op.command == "DEL":
            if ok:
                att.state, att.may_hold = "deleted", False
            else:
                # Half done, perhaps: the runtime only knows to DEL again.
                att.state = "unknown"
                if ans.rc is not None and not op.faults & EXCUSES:
                    self.violate(
                        f"DEL {att.container} failed with no fault injected: {ans.stdout.strip()} {att.history}"
                    )
        elif op.command == "CHECK" and not ok and ans.rc is not None and not op.faults & EXCUSES:
            self.violate(f"CHECK {att.container} of a live attachment failed: {ans.stdout.strip()} {att.history}")

    def violate(self, what: str) -> None:
        self.violations.append(what)
        print(f"stress: VIOLATION: {what}", file=sys.stderr, flush=True)

    # -- invariants

    def check_store(self) -> None:
        """Every record is readable, whenever we look."""
        vfs = self.data_dir / "vfs"
        for path in vfs.glob("*.json") if vfs.is_dir() else []:
            try:
                json.loads(path.read_text())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                self.violate(f"store record {path.name} unreadable: {exc}")

    def check_kernel(self) -> None:
        """With nothing in flight: the pods as the kernel shows them."""
        owner: dict[str, str] = {}
        for att in self.attachments:
            if att.netns_gone:
                continue
            held = self.node.vfs_in(att.netns_name)
            for ifname, pci in held.items():
                if pci in owner:
                    self.violate(f"VF {pci} is in pods {owner[pci]} and {att.container}")
                owner[pci] = att.container
                if not att.may_hold:
                    self.violate(
                        f"VF {pci} ({ifname}) is in pod {att.container}, whose ADD failed or was DELeted: {att.history}"
                    )
            if att.state == "live" and held.get(att.ifname) != att.pci:
                self.violate(
                    f"live attachment {att.container} should have VF {att.pci} as {att.ifname} in its pod,"
                    f" has {held}: {att.history}"
                )

    def check_data_path(self) -> None:
        """With nothing in flight, on a real NIC: two live pods on one PF and network ping each other both ways.

        A pod the plugin reports attached must have traffic, whichever pods
        had its VF before.
        """
        if not isinstance(self.node, IgbNode):
            return
        groups: dict[tuple[str, str], list[Attachment]] = collections.defaultdict(list)
        for att in self.attachments:
            if att.state == "live" and not att.netns_gone and att.prev is not None and att.pci:
                groups[(att.network, self.node.pf_of[att.pci])].append(att)
        pairs = [group[-2:] for group in groups.values() if len(group) >= 2]
        if not pairs:
            return
        a, b = pairs[0]
        for src, dst in ((a, b), (b, a)):
            problem = self.node.ping(src, dst)
            if problem:
                self.violate(f"data path: {problem}: {src.history} / {dst.history}")
        self.pings += 1

    def drain(self) -> None:
        while self.running:
            self.pump(0.05)

    def run(self, ops: int) -> None:
        check_every = max(10, self.concurrency * 5)
        enospc_windows = max(1, ops // 150)
        enospc_starts = sorted(self.rng.sample(range(ops), min(ops, enospc_windows)), reverse=True)
        while self.started < ops:
            if enospc_starts and self.started >= enospc_starts[-1] and not self.state.full:
                enospc_starts.pop()
                self.drain()
                self.state.fill()
                self.enospc_left = self.rng.randint(3, 12)
                self.faults["enospc_window"] += 1
            while len(self.running) < self.concurrency and self.started < ops:
                self.launch()
                if self.state.full:
                    self.enospc_left -= 1
                    if self.enospc_left <= 0:
                        break
            self.pump(0.05)
            if self.state.full and self.enospc_left <= 0:
                self.drain()
                self.state.drain()
            if self.started % check_every == 0:
                self.drain()
                self.check_kernel()
                self.check_data_path()

        self.drain()
        if self.state.full:
            self.state.drain()
        self.check_kernel()

    def finish(self, start_pf: dict[str, Any], start_host: dict[str, NetdevView | None]) -> None:
        """GC everything, then the node must be as it was; with a daemon that heals, lost pods' VFs first."""
        if self.heals:
            self.check_healed()
        for network in NETWORKS:
            conf = self.conf(network)
            conf["cni.dev/valid-attachments"] = []
            op = self.submit("GC", None, conf, self.env("GC", None), set(), None, 60.0)
            self.drain()
            out = op.call.out.decode(errors="replace")
            if out.strip():
                self.violate(f"final GC of {network} failed: {out.strip()}")
        for att in self.attachments:
            if not att.netns_gone:
                left = self.node.vfs_in(att.netns_name)
                if left:
                    self.violate(f"after the final GC pod {att.container} still holds {left}")
        host = self.node.host_netdevs()
        for pci, before in start_host.items():
            if host.get(pci) != before:
                self.violate(f"VF {pci} is {host.get(pci)} in the host, was {before}")
        end_pf = self.node.pf_side()
        for pf, before in start_pf.items():
            if end_pf.get(pf) != before:
                self.violate(f"PF {pf}'s VFs differ from the start: now {end_pf.get(pf)}, was {before}")
        records = sorted(p.name for p in (self.data_dir / "vfs").glob("*.json"))
        if records:
            self.violate(f"store records left: {records}")
        for network in NETWORKS:
            held = _addresses(self.ipam_dir / network)
            if held:
                self.violate(f"IPAM of {network} still holds {sorted(held)}")

    def close(self) -> None:
        for att in self.attachments:
            if not att.netns_gone:
                subprocess.run(["ip", "netns", "del", att.netns_name], check=False)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _owners(directory: Path) -> set[str]:
    """The containers holding addresses in a host-local-layout store (host-local and sriov-ipam share it)."""
    out = set()
    for address in _addresses(directory):
        out.add((directory / address).read_text().split("\n")[0].strip())
    return out


def _addresses(directory: Path) -> set[str]:
    import ipaddress

    out = set()
    for name in os.listdir(directory) if directory.is_dir() else []:
        try:
            out.add(str(ipaddress.ip_address(name)))
        except ValueError:
            continue
    return out


# --- entry -----------------------------------------------------------------------


def stress(
    ops: int, seed: int, node_kind: str = "host", concurrency: int = 4, vfs: int = 8, deadline: float = 10.0
) -> tuple[str, list[str]]:
    """Run; return the summary line and the violations."""
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="sriov-stress-"))
    node: HostNode | IgbNode | None = None
    state: StateDir | None = None
    transport: Transport | None = None
    driver: Driver | None = None
    try:
        state = StateDir(work / "state")
        if node_kind == "host":
            node = HostNode(work, 2, vfs)
            transport = ForkTransport(node.deps)
            ipam_exe = REPO / "bin" / "sriov-ipam"
        else:
            from sriov_cni.daemon import install
            from tests.support.daemonlib import command_line

            node = IgbNode(vfs)
            shims = work / "shims"
            install.install(str(shims), None)
            socket_path = str(work / "daemon" / "plugin.sock")
            # Started by ExecTransport itself, not daemonlib.Daemon: a fault may
            # kill it and restart it, and nobody reads its stderr in a long run.
            # It heals the plugin's store: pods the run loses are its to give back.
            daemon = command_line(socket_path, "--data-dir", str(state.path / "sriov"))
            transport = ExecTransport([str(shims / "sriov")], daemon, socket_path)
            ipam_exe = shims / "sriov-ipam"
        driver = Driver(node, transport, state, rng, concurrency, deadline, work, ipam_exe, heals=node_kind == "igb")
        start_pf, start_host = node.pf_side(), node.host_netdevs()
        started = time.monotonic()
        driver.run(ops)
        driver.finish(start_pf, start_host)
        elapsed = time.monotonic() - started
        faults = " ".join(f"{k}={v}" for k, v in sorted(driver.faults.items()))
        by_op = " ".join(f"{k}={v}" for k, v in sorted(driver.ops.items()))
        pings = f"pod pairs pinged={driver.pings} " if node_kind == "igb" else ""
        summary = (
            f"stress: node={node_kind} ops={driver.started} ({by_op}) faults: {faults} "
            f"{pings}violations={len(driver.violations)} seed={seed} in {elapsed:.0f} s"
        )
        return summary, driver.violations
    finally:
        for part in (driver, transport, node, state):
            if part is not None:
                part.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--node", choices=("host", "igb"), default="host")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--vfs", type=int, help="VFs per PF (2 PFs); default 8 on host, 7 (all an 82576 has) on igb")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds before a call is killed as hung")
    args = parser.parse_args()
    vfs = args.vfs or (7 if args.node == "igb" else 8)
    summary, violations = stress(args.ops, args.seed, args.node, args.concurrency, vfs, args.deadline)
    print(summary, flush=True)
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
