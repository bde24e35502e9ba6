"""irqbalance, which moves IRQs every 10 s: kept off the IRQs we pin, stopped, or left alone.

irqbalance 1.9 has three ways to keep its hands off an IRQ, and only one
fits IRQs that come and go:

- ``--banirq=N`` names IRQ numbers when it starts.  A VF's IRQs appear only
  when a pod brings the VF up, and a number later reused by another device
  stays banned.
- ``settings ban irqs ...`` on its control socket replaces every ban,
  ``--banirq``'s included, and lives only as long as that process.
- A policy script (``--policyscript=FILE``) is asked, with the device's
  sysfs path and the IRQ number, each time irqbalance takes an IRQ on: at
  start, on every rescan (SIGHUP), and when a new IRQ shows up in
  /proc/interrupts, as a pod's VF IRQs do.  irqbalance forgets an IRQ that
  goes away, ban and all, and asks again when its number comes back.

So ``ban`` writes a policy script that answers ``ban=true`` for every IRQ
of a tuned PF and of the VFs under it, judged by device rather than number,
and makes a running irqbalance that uses the script rescan.  Which script
irqbalance runs is its service's configuration (``IRQBALANCE_ARGS`` in
/etc/default/irqbalance on Debian), which stays the node owner's: setup
says so when irqbalance runs without ours.  The script bans a device's misc
and mailbox vectors too; they stay where the kernel put them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sriov_cni import nodestate

UNIT = "irqbalance.service"
STOP_TIMEOUT = 10.0
# How long a rescan waits for irqbalance to take SIGHUP at all (see _rescan).
HUP_TIMEOUT = 30.0
# irqbalance's default --interval, in seconds.
DEFAULT_INTERVAL = 10

# The script's one line that names the PFs; read back by banned_pfs.
_PFS_LINE = "pfs="


@dataclass(frozen=True)
class Instance:
    pid: int
    policy_script: Path | None  # as given on its command line, made absolute
    interval: int  # seconds between its scans
    started: float  # CLOCK_BOOTTIME seconds


def policy_script(state_file: Path) -> Path:
    """The policy script setup writes, next to the node state file."""
    return state_file.parent / "irqbalance-policy"


def _option(args: list[str], long: str, short: str) -> str | None:
    """An option's value on an irqbalance command line; the last one wins, as in its getopt loop."""
    found = None
    for i, arg in enumerate(args):
        for prefix in (f"{long}=", short):
            if arg.startswith(prefix) and len(arg) > len(prefix):
                found = arg[len(prefix) :]
        if arg in (long, short) and i + 1 < len(args):
            found = args[i + 1]
    return found


def _instance(proc: Path, pid: int) -> Instance | None:
    base = proc / str(pid)
    try:
        if (base / "comm").read_text().strip() != "irqbalance":
            return None
        stat = (base / "stat").read_text().rpartition(")")[2].split()
        # A zombie has ended; only its parent has yet to reap it.
        if stat[0] == "Z":
            return None
        started = int(stat[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        args = [a.decode(errors="replace") for a in (base / "cmdline").read_bytes().split(b"\0")]
    except (OSError, IndexError, ValueError):
        return None  # exited while we looked
    arg = _option(args, "--policyscript", "-l")
    script = None
    if arg is not None:
        script = Path(arg)
        if not script.is_absolute():
            try:
                script = Path(os.readlink(base / "cwd")) / script
            except OSError:
                pass
    interval = _option(args, "--interval", "-t")
    return Instance(pid, script, int(interval) if interval and interval.isdigit() else DEFAULT_INTERVAL, started)


def _takes_hup(proc: Path, pid: int) -> bool:
    """Whether SIGHUP is blocked, caught or ignored by ``pid`` rather than ending it."""
    try:
        masks = {
            key: int(value, 16)
            for key, _, value in (
                line.partition(":\t") for line in (proc / str(pid) / "status").read_text().splitlines()
            )
            if key in ("SigBlk", "SigIgn", "SigCgt")
        }
    except (OSError, ValueError):
        return False  # ended: nothing to ask
    return any(mask >> (signal.SIGHUP - 1) & 1 for mask in masks.values())


def _rescan(proc: Path, instance: Instance, hup_timeout: float) -> bool:
    """SIGHUP: irqbalance rebuilds its IRQ list, asking the policy script about each IRQ again.

    It ignores the signal until its first scan, one interval after it
    started, so a younger irqbalance (one started with the node, next to
    setup) is given that long first.  Before main() blocks SIGHUP (the
    dynamic loader's work, tens of milliseconds after exec, longer on a
    loaded machine) the signal would end it: it is sent only once the
    kernel shows it blocked or caught.  False when that never happens.
    """
    young = instance.started + instance.interval + 1 - time.clock_gettime(time.CLOCK_BOOTTIME)
    if young > 0:
        time.sleep(young)
    deadline = time.monotonic() + hup_timeout
    while not _takes_hup(proc, instance.pid):
        if time.monotonic() > deadline or not (proc / str(instance.pid) / "status").exists():
            return False
        time.sleep(0.05)
    os.kill(instance.pid, signal.SIGHUP)
    return True


def running(proc: Path) -> list[Instance]:
    """Running irqbalance processes, found by ``<proc>/<pid>/comm``."""
    try:
        entries = os.listdir(proc)
    except OSError:
        return []
    found = (_instance(proc, int(e)) for e in entries if e.isdigit())
    return sorted((i for i in found if i is not None), key=lambda i: i.pid)


def pids(proc: Path) -> list[int]:
    return [i.pid for i in running(proc)]


def script_text(pf_pcis: list[str]) -> str:
    # irqbalance runs this with /bin/sh for every IRQ it takes on, so it
    # stays one fork of readlink at most.  $1 is /sys/bus/pci/devices/<BDF>
    # (or /sys for IRQs without a device), $2 the IRQ number.
    return f"""#!/bin/sh
# Written by sriov-cni setup (irqbalance: ban) and rewritten when its config changes.
# irqbalance asks it about each IRQ it takes on (device path, IRQ number):
# every IRQ of these PFs and of their VFs is banned, so that irqbalance
# leaves the queue IRQs that setup and the CNI plugin pin where they are.
{_PFS_LINE}" {" ".join(sorted(pf_pcis))} "
dev=${{1##*/}}
pf=$(readlink "$1/physfn" 2>/dev/null)
for d in "$dev" "${{pf##*/}}"; do
    case "$d" in "") continue ;; esac
    case "$pfs" in *" $d "*) echo ban=true; exit 0 ;; esac
done
exit 0
"""


def banned_pfs(script: Path) -> set[str]:
    """The PFs a policy script written by setup bans; empty for any other file."""
    try:
        lines = script.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return set()
    if len(lines) < 2 or not lines[1].startswith("# Written by sriov-cni setup"):
        return set()
    for line in lines:
        if line.startswith(_PFS_LINE):
            return set(line[len(_PFS_LINE) :].strip('"').split())
    return set()


def protects(instance: Instance, pf_pci: str) -> bool:
    return instance.policy_script is not None and pf_pci in banned_pfs(instance.policy_script)


def _write_script(path: Path, text: str) -> bool:
    """Replace the script (irqbalance may run it at any moment); False when already so."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    nodestate.replace_file(path, text, 0o755)
    return True


def _quiet(line: str) -> None:
    pass


def ban(
    proc: Path,
    script: Path,
    pf_pcis: list[str],
    announce: Callable[[str], None] = _quiet,
    hup_timeout: float = HUP_TIMEOUT,
) -> list[str]:
    """Write the policy script and have the irqbalance using it ask it again; one line per outcome.

    ``announce`` is told before a wait for irqbalance to take the signal.
    """
    if not pf_pcis and not script.exists():
        return []  # nothing pinned, and no earlier ban to lift
    written = _write_script(script, script_text(pf_pcis))
    which = ", ".join(sorted(pf_pcis)) or "no PF"
    lines = [
        f"irqbalance: policy script {script} bans the IRQs of {which} and their VFs: "
        f"{'written' if written else 'unchanged'}"
    ]
    for instance in running(proc):
        if instance.policy_script is not None and os.path.realpath(instance.policy_script) == os.path.realpath(script):
            if written:
                announce(
                    f"irqbalance (pid {instance.pid}): asking it to rescan (waiting up to {hup_timeout:.0f} s "
                    "for it to take the signal)"
                )
            if written and _rescan(proc, instance, hup_timeout):
                lines.append(f"irqbalance (pid {instance.pid}): uses the policy script: asked to rescan")
            elif written:
                lines.append(
                    f"warning: irqbalance (pid {instance.pid}) uses the policy script but took no SIGHUP within "
                    f"{hup_timeout:.0f} s (still starting, or ended), so it was not asked to rescan: restart it"
                )
        else:
            lines.append(
                f"warning: irqbalance (pid {instance.pid}) runs without --policyscript={script} and will move "
                f"the pinned IRQs back: add that option to its arguments (IRQBALANCE_ARGS in "
                f"/etc/default/irqbalance on Debian) and restart it, or set irqbalance: stop"
            )
    return lines


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60)


def stop(proc: Path, systemd_run: Path, announce: Callable[[str], None] = _quiet) -> list[str]:
    """Stop irqbalance, and disable its unit where systemd runs (``systemd_run`` exists); one line per outcome.

    ``announce`` is told before each stop that may take seconds.
    """
    lines = []
    systemd = systemd_run.is_dir() and shutil.which("systemctl") is not None
    if systemd and any(_systemctl(check, "--quiet", UNIT).returncode == 0 for check in ("is-enabled", "is-active")):
        announce(f"irqbalance: systemctl disable --now {UNIT}")
        done = _systemctl("disable", "--now", UNIT)
        if done.returncode != 0:
            raise OSError(f"systemctl disable --now {UNIT}: {done.stderr.strip() or f'exit status {done.returncode}'}")
        lines.append(f"irqbalance: {UNIT} stopped and disabled")
    # Whatever systemd did not stop (or everything, without systemd) gets
    # SIGTERM.  Nothing then says how it was started, so nothing can disable
    # it: if what started it starts it again, the next setup stops it again.
    stopped = pids(proc)
    if stopped:
        announce(f"irqbalance: stopping pid {', '.join(map(str, stopped))} (waiting up to {STOP_TIMEOUT:.0f} s)")
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    left = stopped
    deadline = time.monotonic() + STOP_TIMEOUT
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in pids(proc) if pid in left]
    if left:
        raise OSError(f"irqbalance (pid {', '.join(map(str, left))}) still runs {STOP_TIMEOUT:.0f} s after SIGTERM")
    if stopped:
        how = "" if systemd else " (no systemd: nothing to disable, it stays off until something starts it again)"
        lines.append(f"irqbalance: stopped pid {', '.join(map(str, stopped))}{how}")
    return lines or ["irqbalance: not running: unchanged"]


def advice(running_pids: list[int], irqs: list[int]) -> str:
    ban_args = " ".join(f"--banirq={irq}" for irq in irqs)
    return (
        f"irqbalance (pid {', '.join(map(str, running_pids))}) is running and will move the pinned IRQs "
        f"back within 10 s: stop it (systemctl disable --now irqbalance), or add "
        f'IRQBALANCE_ARGS="{ban_args}" to its environment file and restart it '
        f"(VF IRQs are pinned by the CNI plugin as pods start; ban those too, or stop irqbalance), "
        f"or set irqbalance: ban or stop in the node config"
    )
