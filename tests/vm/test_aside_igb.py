"""A VF that never comes up is set aside and the next one serves the pod (runs in the rig's QEMU guest).

Real: igb/igbvf, the plugin in process with its real dependencies (the
carrier wait included), the node command's ``status``, ping between pods.
Two stand-ins for a broken VF, each a real failure of the emulated NIC:

- one VF whose memory space is turned off in its PCI command register:
  QEMU then unmaps its registers, so its driver never hears from the PF
  and it never gets carrier, while the PF's other VFs work (this
  emulation honours the bit; real VFs hard-wire it to zero);
- every VF of a guest with more memory than QEMU's igb handles (q35 puts
  the VF BARs above 4 GiB, and QEMU before 10.1.2 maps them nowhere): the
  ``broken_vfs`` test, run in a boot of its own (tests/run.sh).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.plugin import aside
from sriov_cni.vfstore import FileStore
from tests.vm.nodecommand import Node
from tests.vm.plugincalls import Pod, cni, conf, ns_path, ping, records
from tests.vm.vmlib import Sriov, vf_pci_dirs

pytestmark = pytest.mark.sriov_vm

# Bit 1 of the PCI command register: Memory Space Enable.
_MEMORY_SPACE = 0x2


@contextmanager
def memory_space_off(pci: str) -> Iterator[None]:
    """The VF's registers unmapped for the block (the rig's VF watch passes over such a VF on purpose)."""
    fd = os.open(f"/sys/bus/pci/devices/{pci}/config", os.O_RDWR)
    try:
        saved = os.pread(fd, 1, 4)
        os.pwrite(fd, bytes([saved[0] & ~_MEMORY_SPACE]), 4)
        try:
            yield
        finally:
            os.pwrite(fd, saved, 4)
    finally:
        os.close(fd)


def status_of(node: Node, data: Path) -> dict[str, dict[str, Any]]:
    out = node.run("status", "--json", "--data-dir", str(data))
    assert out.returncode == 0, out.stdout + out.stderr
    return {vf["pci"]: vf for pf in json.loads(out.stdout)["pfs"] for vf in pf["vfs"]}


def address(res: Any) -> str:
    return str(res["ips"][0]["address"].split("/")[0])


def test_a_broken_vf_is_set_aside_and_the_next_serves_the_pod_until_it_works_again(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node, tmp_path: Path
) -> None:
    pf = igb_pfs[0]
    sriov.enable(pf, 3)
    broken, first_good, second_good = (d.name for d in vf_pci_dirs(pf))
    # 1.1.0: the result names the VF (pciID).
    cfg = dict(conf(tmp_path, pf, None, Pod(None, None)), cniVersion="1.1.0")
    store = FileStore(tmp_path)
    pods = {name: netns() for name in ("a", "b", "c")}
    with memory_space_off(broken):
        started = time.monotonic()
        rc, res_a = cni("ADD", cfg, container="a", netns=ns_path(pods["a"]))
        took = time.monotonic() - started
        assert rc == 0, res_a
        assert res_a["interfaces"][0]["pciID"] == first_good
        print(f"ADD with the first VF broken and the second working: {took:.1f} s")
        record = store.aside()[broken]
        assert (record.reason, record.failures) == (aside.NO_CARRIER, 1)
        shown = status_of(node, tmp_path)[broken]
        print(f"status of the broken VF: {shown['state']} {shown['setAside']}")
        assert shown["state"] == "set aside" and shown["setAside"]["reason"] == "no carrier"
        # The next pod is not made to wait for it again.
        rc, res_b = cni("ADD", cfg, container="b", netns=ns_path(pods["b"]))
        assert rc == 0, res_b
        assert res_b["interfaces"][0]["pciID"] == second_good
        assert store.aside()[broken].failures == 1
        ping(pods["a"], address(res_b))
        ping(pods["b"], address(res_a))

    # Mended, and its back-off over (set here rather than waited for): with
    # the others held, it serves the next pod and is back in the pool.
    record = store.aside()[broken]
    record.retry_after = time.time() - 1
    store.set_aside(record)
    rc, res_c = cni("ADD", cfg, container="c", netns=ns_path(pods["c"]))
    assert rc == 0, res_c
    assert res_c["interfaces"][0]["pciID"] == broken
    assert store.aside() == {}
    ping(pods["c"], address(res_a))
    ping(pods["a"], address(res_c))
    for name, pod in pods.items():
        rc, out = cni("DEL", cfg, container=name, netns=ns_path(pod))
        assert rc == 0, out
    assert records(tmp_path) == []


@pytest.mark.broken_vfs
def test_when_no_vf_comes_up_add_names_each_one_tried_and_status_shows_them(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], node: Node, tmp_path: Path
) -> None:
    """A guest whose every igb VF stays without carrier (rig.py --memory 3072 --allow-broken-vfs)."""
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    vfs = [d.name for d in vf_pci_dirs(pf)]
    cfg = conf(tmp_path, pf, None, Pod(None, None))
    pod = netns()
    started = time.monotonic()
    rc, res = cni("ADD", cfg, container="a", netns=ns_path(pod))
    took = time.monotonic() - started
    print(f"ADD with every VF broken: {took:.1f} s, {res}")
    assert rc != 0 and res["code"] == 100 and "no VF came up" in res["msg"], res
    # Two 20 s waits fit in ADD's 60 s; then no other VF is free.
    assert [vf for vf in vfs if f"VF {vf}:" in res["details"]] == vfs, res["details"]
    shown = status_of(node, tmp_path)
    assert [shown[vf]["state"] for vf in vfs] == ["set aside"] * 2
    assert records(tmp_path) == []
    # Within their back-off the next ADD tries none, and says why.
    rc, res = cni("ADD", cfg, container="b", netns=ns_path(netns()))
    assert rc != 0 and res["code"] == 101 and "set aside" in res["details"], res
