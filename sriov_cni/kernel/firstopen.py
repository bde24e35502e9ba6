"""A new VF opened and closed once, so that its first reset is not a pod's.

igbvf probes a new VF while igb is still setting the PF up for SR-IOV (or
while the PF is down: setup brings its link up after creating the VFs).
The probe's reset then gets no answer from the PF ("PF still in reset
state" in the kernel log), and the VF is left with its mailbox timed out.
When the VF is opened later, its watchdog finds the mailbox in that state
and schedules a reset, but only 10 s after the VF's last reset
(``igbvf_has_link``), and the VF reports carrier only after it.  A pod that
got such a VF had no traffic for seconds after ADD.  A VF that was opened
and closed once, with its PF up, is past this: a close resets it at once
(``igbvf_down``), the PF answers, and every later open reports carrier on
the watchdog's next run.  So setup does it, after bringing the PF up, and
ADD does it for a VF that never had carrier (one created by another tool,
or before its PF was up) before the pod gets it: without it, each of a
pod's networks on such VFs waited out the reset gap in its ADD, one after
the other.

The reset also makes igbvf program its netdev's MAC into the PF's receive
filter, which the PF then reports as the VF's MAC.  A new VF reads zero
there, and a VF given back by DEL does too (see sriov_cni.plugin.attach):
the PF's reading is put back to zero, so that setup leaves every VF as a
pod's DEL does, and a later ADD records the same state for it.
"""

from __future__ import annotations

from sriov_cni.kernel import netlink, vfsettings


class FirstOpenError(Exception):
    pass


def open_once(pf: str, vf: int, netdev: str, mac: str | None = None) -> None:
    """Open VF netdev ``netdev`` (VF ``vf`` of ``pf``) and close it; the PF's reading of its MAC stays as it was.

    ``mac``: that reading, when the caller has it (one request for every VF
    of the PF fewer); None reads it.
    """
    vfc = netlink.KernelVfControl()
    try:
        before = vfc.vfs(pf).get(vf) if mac is None else None
        mac = before.mac if before is not None else mac
        with netlink.open_namespace() as host:
            link = host.find(netdev)
            if link is None:
                raise FirstOpenError(f"VF {vf} of {pf}: no netdev {netdev}")
            if link.up:
                # Opened already, by someone else: past its first reset.
                return
            host.set_up(link.index, True)
            host.set_up(link.index, False)
        if mac == vfsettings.ZERO_MAC:
            after = vfc.vfs(pf).get(vf)
            if after is not None and after.mac != mac:
                vfc.set_mac(pf, vf, vfsettings.ZERO_MAC)
    except netlink.NetlinkError as exc:
        raise FirstOpenError(f"VF {vf} of {pf} ({netdev}): {exc}") from exc
    finally:
        vfc.close()
