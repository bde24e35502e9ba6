"""``sriov-cni setup``/``status`` and the per-VF tuning hook on the real igb/igbvf driver.

Runs in the rig's guest (PFs without NUMA node; as many CPUs as the host
can run at once, so the expected CPUs are derived from the online list).  Effects are read
back from sysfs, /proc/irq and /proc/interrupts, or from inside the pod
namespace with ``ip netns exec``, never from what the command printed alone.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.kernel import sysfs
from sriov_cni.node import setup as node_setup
from sriov_cni.paths import Paths
from sriov_cni.plugin import tuning
from sriov_cni.vfstore import Allocation, FileStore
from tests.vm.nodecommand import Node, affinity, interrupts, online, vf_netdevs
from tests.vm.plugincalls import cni, ns_path, vfinfo
from tests.vm.vmlib import SYS_NET, numvfs, vf_pci_dirs

pytestmark = pytest.mark.sriov_vm


def mask(cpus: list[int]) -> str:
    return format(sum(1 << cpu for cpu in cpus), "x")


def ifindexes(names: list[str]) -> list[int]:
    return [int((SYS_NET / n / "ifindex").read_text()) for n in names]


def test_creates_vfs_pins_pf_queues_and_a_second_run_changes_nothing(node: Node, igb_pfs: list[str]) -> None:
    pf0, pf1 = igb_pfs
    all_cpus, cpus = online()
    upper = cpus[len(cpus) // 2 :]
    config = f"""
pfs:
  - pf: {pf0}
    numVfs: 7
    mtu: 1600
    tuning: {{rps: true, xps: true, rfsFlowEntries: 4096}}
  - pf: {pf1}
    numVfs: 3
    tuning: {{irqCpus: "{",".join(map(str, upper))}"}}
"""
    first = node.setup(config)
    assert first.returncode == 0, first.stderr
    assert (numvfs(pf0), numvfs(pf1)) == (7, 3)
    vfs0, vfs1 = vf_netdevs(pf0), vf_netdevs(pf1)
    assert (len(vfs0), len(vfs1)) == (7, 3)
    assert int((SYS_NET / pf0 / "mtu").read_text()) == 1600
    assert int((SYS_NET / pf1 / "flags").read_text(), 16) & 1

    # igb names its vectors <pf>, <pf>-TxRx-<q> (or -rx-/-tx- without VFs).
    names = interrupts()
    for pf, pinned in ((pf0, cpus), (pf1, upper)):
        queues = {n: irq for n, irq in names.items() if re.fullmatch(rf"{pf}-(TxRx|rx|tx)-\d+", n)}
        assert queues, f"no queue IRQs of {pf} in /proc/interrupts"
        for name, irq in queues.items():
            q = int(name.rsplit("-", 1)[1])
            assert affinity(irq) == str(pinned[q % len(pinned)]), name
        assert affinity(names[pf]) == all_cpus  # the misc vector is left alone
    assert Path(f"/sys/class/net/{pf0}/queues/rx-0/rps_cpus").read_text().strip() == mask(cpus)
    assert int(Path("/proc/sys/net/core/rps_sock_flow_entries").read_text()) >= 4096

    before = ifindexes(vfs0 + vfs1)
    second = node.setup(config)
    assert second.returncode == 0, second.stderr
    assert "sriov_numvfs 7: unchanged" in second.stdout
    assert "sriov_numvfs 3: unchanged" in second.stdout
    lines = second.stdout.splitlines()
    assert all(line.endswith("unchanged") for line in lines), second.stdout
    # Same VFs, not recreated: recreated netdevs get new ifindexes.
    assert (numvfs(pf0), numvfs(pf1)) == (7, 3)
    assert ifindexes(vf_netdevs(pf0) + vf_netdevs(pf1)) == before


def _allocate(node: Node, pf: str, index: int, ifname: str, netns: str) -> str:
    vf_pci = vf_pci_dirs(pf)[index].name
    pf_pci = (SYS_NET / pf / "device").resolve().name
    FileStore(node.data).put(
        Allocation(vf_pci, pf_pci, pf, index, "net-a", "cafe01", ifname, f"/run/netns/{netns}", None)
    )
    return vf_pci


def test_count_change_is_refused_while_a_vf_is_allocated(
    node: Node, igb_pfs: list[str], netns: Callable[[], str]
) -> None:
    pf = igb_pfs[0]
    assert node.setup(f"pfs: [{{pf: {pf}, numVfs: 7}}]").returncode == 0
    names = vf_netdevs(pf)
    before = ifindexes(names)
    _allocate(node, pf, 2, "net1", netns())
    refused = node.setup(f"pfs: [{{pf: {pf}, numVfs: 3}}]")
    assert refused.returncode == 1
    assert refused.stderr == (
        f"Error: refusing to change {pf} from 7 to 3 VFs: the change goes through 0 and would destroy "
        f"allocated VFs: VF 2 (net-a, container cafe01, net1)\n"
    )
    assert numvfs(pf) == 7 and ifindexes(vf_netdevs(pf)) == before


def _in_ns(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True).stdout.strip()


def test_vf_hook_pins_and_sets_rps_in_the_pod_then_releases(
    node: Node, igb_pfs: list[str], netns: Callable[[], str]
) -> None:
    pf = igb_pfs[0]
    all_cpus, cpus = online()
    done = node.setup(
        f"pfs: [{{pf: {pf}, numVfs: 3, tuning: {{irqCpus: {all_cpus}, rps: true, rfsFlowEntries: 2048}}}}]"
    )
    assert done.returncode == 0, done.stderr
    index = 1
    vf_pci = vf_pci_dirs(pf)[index].name
    host_name = vf_netdevs(pf)[index]
    ns = netns()
    subprocess.run(["ip", "link", "set", host_name, "netns", ns], check=True)
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", host_name, "name", "net1"], check=True)
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "net1", "up"], check=True)

    vf = sysfs.resolve_vf(Paths().sys, vf_pci)
    assert tuning.apply_vf_tuning(Paths(state_file=node.state), vf, f"/run/netns/{ns}", "net1") == []
    # igbvf requested its vectors on open, named after the pod-side name.
    names = interrupts()
    want = str(cpus[(index + 1) % len(cpus)])
    assert (affinity(names["net1-rx-0"]), affinity(names["net1-tx-0"])) == (want, want)
    assert _in_ns(ns, "cat", "/sys/class/net/net1/queues/rx-0/rps_cpus") == mask(cpus)
    assert _in_ns(ns, "cat", "/sys/class/net/net1/queues/rx-0/rps_flow_cnt") == "2048"

    # Released while still up in the pod, as the plugin's DEL does: a
    # closed igbvf's vectors ignore affinity writes.
    tuning.clear_vf_tuning(Paths(state_file=node.state), vf_pci, f"/run/netns/{ns}", "net1")
    assert (affinity(names["net1-rx-0"]), affinity(names["net1-tx-0"])) == (all_cpus, all_cpus)
    assert _in_ns(ns, "cat", "/sys/class/net/net1/queues/rx-0/rps_cpus") == "0"
    assert _in_ns(ns, "cat", "/sys/class/net/net1/queues/rx-0/rps_flow_cnt") == "0"
    # RPS maps travel with the queue: nothing comes back to the host either.
    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "net1", "netns", "1"], check=True)
    assert Path("/sys/class/net/net1/queues/rx-0/rps_cpus").read_text().strip() == "0"


def test_status_json_shows_an_allocation_then_the_vf_free(
    node: Node, igb_pfs: list[str], netns: Callable[[], str]
) -> None:
    pf = igb_pfs[0]
    assert node.setup(f"pfs: [{{pf: {pf}, numVfs: 2}}]").returncode == 0
    ns = netns()
    name = vf_netdevs(pf)[0]
    subprocess.run(["ip", "link", "set", name, "netns", ns], check=True)
    vf_pci = _allocate(node, pf, 0, name, ns)

    def vf0() -> dict[str, object]:
        done = node.run("status", "--json", "--data-dir", str(node.data))
        assert done.returncode == 0, done.stderr
        [mine] = [p for p in json.loads(done.stdout)["pfs"] if p["netdev"] == pf]
        assert (mine["numVfs"], mine["totalVfs"], mine["driver"]) == (2, 7, "igb")
        return dict(mine["vfs"][0])

    vf = vf0()
    assert (vf["pci"], vf["state"], vf["netdev"]) == (vf_pci, "allocated", None)
    assert vf["allocation"] == {
        "network": "net-a",
        "containerID": "cafe01",
        # The call's CNI_ARGS named no pod.
        "pod": None,
        "podUID": None,
        "ifname": name,
        "netns": f"/run/netns/{ns}",
        "deviceInfoFile": None,
        "gone": None,
        "unrestored": [],
    }
    # What a pod on this VF is told of it (igb: no RDMA device).
    assert vf["deviceInfo"] == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": vf_pci, "pf-pci-address": (SYS_NET / pf / "device").resolve().name},
    }

    subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", name, "netns", "1"], check=True)
    FileStore(node.data).remove(vf_pci)
    vf = vf0()
    assert (vf["state"], vf["allocation"], vf["netdev"]) == ("free", None, name)


def test_vfs_setup_created_carry_the_first_pods_traffic_when_add_returns(
    node: Node, igb_pfs: list[str], netns: Callable[[], str], tmp_path: Path
) -> None:
    """Two pods without ``mac`` on VFs setup just created, with the PF down before: as a fresh node.

    Each pod pings the other once, right after both ADDs returned, with
    nothing waited for in between: setup has opened each new VF once (its
    first reset), and ADD returns once the VF has carrier.  The oracle is the
    traffic, and the PF's reading of each VF: zero after setup and after DEL,
    as for a VF nobody opened.
    """
    pf = igb_pfs[0]
    subprocess.run(["ip", "link", "set", pf, "down"], check=True)
    done = node.setup(f"pfs: [{{pf: {pf}, numVfs: 2}}]")
    assert done.returncode == 0, done.stderr
    assert "new VFs opened and closed once: 2 VFs" in done.stdout
    before = [vfinfo(pf, i) for i in range(2)]
    assert [b["address"] for b in before] == ["00:00:00:00:00:00"] * 2
    two_pods_ping(pf, netns, tmp_path, "firstnet", "10.85.0.0/24")
    assert [vfinfo(pf, i) for i in range(2)] == before


def test_admin_macs_are_set_and_the_vfs_rebound_once_and_pods_still_ping(
    node: Node, igb_pfs: list[str], netns: Callable[[], str], tmp_path: Path
) -> None:
    """``adminMacs``, what igb can show of it: the admin MAC through the PF, the rebind, then traffic.

    (On mlx5 the rebind is what turns the admin MAC into the VF's node
    GUID, which rdma_cm needs; igb has no node GUID.)
    """
    pf = igb_pfs[0]
    config = f"pfs: [{{pf: {pf}, numVfs: 2, adminMacs: true}}]"
    done = node.setup(config)
    assert done.returncode == 0, done.stderr
    assert "VFs without an admin MAC given one, then rebound: 2 VFs given an admin MAC and rebound" in done.stdout
    pf_mac = (SYS_NET / pf / "address").read_text().strip()
    expected = [node_setup.admin_mac(pf_mac, i) for i in range(2)]
    assert [vfinfo(pf, i)["address"] for i in range(2)] == expected
    # Rebound: igbvf probed each VF again, and took the admin MAC then.
    assert [(SYS_NET / name / "address").read_text().strip() for name in vf_netdevs(pf)] == expected
    again = node.setup(config)
    assert again.returncode == 0, again.stderr
    assert "every VF has an admin MAC: unchanged" in again.stdout
    results = two_pods_ping(pf, netns, tmp_path, "macnet", "10.86.0.0/24")
    assert sorted(r["interfaces"][0]["mac"] for r in results) == sorted(expected)
    assert [vfinfo(pf, i)["address"] for i in range(2)] == expected


def two_pods_ping(pf: str, netns: Callable[[], str], tmp_path: Path, name: str, subnet: str) -> list[Any]:
    """Two pods on ``pf``'s VFs (no ``mac``), each pinging the other once as soon as both ADDs returned, then DEL.

    Returns the ADDs' results.
    """
    conf = {
        "cniVersion": "1.0.0",
        "name": name,
        "type": "sriov",
        "pfNames": [pf],
        "dataDir": str(tmp_path / "plugin"),
        "ipam": {"type": "sriov-ipam", "subnet": subnet, "dataDir": str(tmp_path / "ipam")},
    }
    pods = [netns(), netns()]
    results = []
    for i, pod in enumerate(pods):
        rc, res = cni("ADD", conf, container=f"{name}{i}", netns=ns_path(pod))
        assert rc == 0, res
        results.append(res)
    for i, pod in enumerate(pods):
        peer = results[1 - i]["ips"][0]["address"].split("/")[0]
        ping = subprocess.run(
            ["ip", "netns", "exec", pod, "ping", "-c", "1", "-W", "5", peer], capture_output=True, text=True
        )
        assert ping.returncode == 0, f"{pod} -> {peer}: {ping.stdout}{ping.stderr}"
    for i, pod in enumerate(pods):
        rc, res = cni("DEL", conf, container=f"{name}{i}", netns=ns_path(pod))
        assert rc == 0, res
    return results
