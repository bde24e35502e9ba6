"""Detecting irqbalance, which moves pinned IRQs back within its 10 s interval.

Setup does not reconfigure or stop it: how irqbalance is run (service,
env file location, other bans) is the node owner's call.  It says plainly
what will happen and what to do instead.
"""

from __future__ import annotations

import os

from sriov_cni.kernel import sysfs


def pids() -> list[int]:
    """Running irqbalance processes, found by ``/proc/<pid>/comm``."""
    found: list[int] = []
    try:
        entries = os.listdir(sysfs.PROC)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            comm = (sysfs.PROC / entry / "comm").read_text().strip()
        except OSError:
            continue  # exited while we looked
        if comm == "irqbalance":
            found.append(int(entry))
    return sorted(found)


def advice(running: list[int], irqs: list[int]) -> str:
    ban = " ".join(f"--banirq={irq}" for irq in irqs)
    return (
        f"irqbalance (pid {', '.join(map(str, running))}) is running and will move the pinned IRQs "
        f"back within 10 s: stop it (systemctl disable --now irqbalance), or add "
        f"IRQBALANCE_ARGS=\"{ban}\" to its environment file and restart it "
        f"(VF IRQs are pinned by the CNI plugin as pods start; ban those too, or stop irqbalance)"
    )
