"""``"rdma": "soft"``: two pods on two igb VFs get a Soft-RoCE device each and move RDMA traffic between them.

Real: Linux 7.2 (rig.py --kernel sid) in shared RDMA netns mode, and 7.3
(--kernel experimental) in exclusive mode, where each pod sees only its own
device; igb and
igbvf on the emulated 82576 (which switches the two VFs' traffic), rdma_rxe,
the plugin in process with its real dependencies, sriov-ipam, and the verbs
tools of rdma-core and perftest run inside the pods.  No fixture: the rxe
devices are the plugin's, made inside each pod on its VF, and the GID index
each pod is told (its device-info file) is the one its traffic runs with.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sriov_cni.plugin.rdma import soft_name
from tests.support.daemonlib import Daemon
from tests.vm.plugincalls import cni, ns_path, records
from tests.vm.rdmalib import (
    IB_WRITE_BW_PORT,
    PINGPONG_PORT,
    exclusive_pods,
    rdma_ucm,
    roce_v2_gid_index,
    run_pair,
)
from tests.vm.vmlib import Sriov, vf_pci_dirs

# Driver tests like every other here; rdma_vm names the kernel they need.
pytestmark = pytest.mark.sriov_vm

RPING_PORT = 18517
# ib_write_bw -R's rdma_cm port (its TCP exchange port is not used with -R).
IB_WRITE_BW_CM_PORT = 18518


def rdma_devs() -> list[str]:
    out = subprocess.run(["rdma", "-j", "dev"], check=True, capture_output=True, text=True).stdout
    return [str(d["ifname"]) for d in json.loads(out or "[]")]


def cm_listens(pod: str, port: int) -> bool:
    """An rdma_cm server's listening cm_id shows in ``rdma res`` (no socket does)."""
    out = subprocess.run(["rdma", "res", "show", "cm_id"], capture_output=True, text=True).stdout
    return any("LISTEN" in line and f":{port} " in f"{line} " for line in out.splitlines())


@pytest.mark.rdma_vm("7.2")
def test_two_pods_move_rdma_traffic_both_ways_72(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    """Shared mode, rdma_cm included: rping and ib_write_bw -R connect by the pods' IP addresses."""
    with rdma_ucm():
        _traffic(igb_pfs, sriov, netns, tmp_path, exclusive=False)


@pytest.fixture
def exclusive_mode() -> Iterator[None]:
    """Exclusive mode for the test; requested before ``netns``, so it is torn down after the pods are gone."""
    with exclusive_pods("unused"):
        yield


@pytest.mark.rdma_vm("7.3")
def test_two_pods_move_rdma_traffic_both_ways_exclusive_73(
    exclusive_mode: None, igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path
) -> None:
    _traffic(igb_pfs, sriov, netns, tmp_path, exclusive=True)


def _rdma_cm(order: list[str], counters: list[tuple[str | None, str]], server: str, client: str, address: str) -> None:
    """Through rdma_cm (librdmacm), as ps-lite's RDMA van and UCX connect: by IP address, no GID index given.

    Shared mode only: 7.3's rxe cannot re-create its GSI QP after a move
    into a namespace, so rdma_cm has nothing to send on in exclusive mode.
    """
    _, cli_out = run_pair(
        order,
        counters,
        ["rping", "-s", "-a", address, "-p", str(RPING_PORT)],
        ["rping", "-c", "-a", address, "-p", str(RPING_PORT), "-C", "20", "-v"],
        RPING_PORT,
        cm_listens,
    )
    print(f"rping, server {order[0]}, client {order[1]}:\n{cli_out}")
    assert cli_out.count("ping data: rdma-ping-") == 20, cli_out
    bw = ["ib_write_bw", "-R", "-F", "-n", "200", "-s", "4096", "--report_gbits", "-p", str(IB_WRITE_BW_CM_PORT)]
    _, cli_out = run_pair(
        order, counters, [*bw, "-d", server], [*bw, "-d", client, address], IB_WRITE_BW_CM_PORT, cm_listens
    )
    print(f"ib_write_bw -R, server {order[0]}, client {order[1]}:\n{cli_out}")
    assert "BW average" in cli_out and "rdma_cm QPs\t : ON" in cli_out, cli_out


def rdma_devs_in(pod: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", pod, "rdma", "-j", "dev"], check=True, capture_output=True, text=True)
    return [str(d["ifname"]) for d in json.loads(out.stdout or "[]")]


def exported_packets(url: str) -> dict[tuple[str, str], float]:
    """Each pod's rxe packet counters as the daemon's exporter serves them: (pod, counter) to value."""
    with urllib.request.urlopen(url, timeout=60) as answer:
        text = answer.read().decode()
    return {
        (s.labels["pod"], s.labels["counter"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sriov_cni_pod_rdma_port_counter" and s.labels["counter"] in ("sent_pkts", "rcvd_pkts")
    }


def _traffic(igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path, *, exclusive: bool) -> None:
    with Daemon(tmp_path / "run", "--data-dir", str(tmp_path), "--metrics-address", "127.0.0.1:0", "--no-nri") as d:
        _traffic_served(igb_pfs, sriov, netns, tmp_path, d.banner.split("metrics on ")[1].strip(), exclusive=exclusive)


def _traffic_served(
    igb_pfs: list[str], sriov: Sriov, netns: Callable[[], str], tmp_path: Path, url: str, *, exclusive: bool
) -> None:
    """The traffic, with the daemon's exporter over the pods' store at ``url``."""
    pf = igb_pfs[0]
    sriov.enable(pf, 2)
    vf_pcis = [d.name for d in vf_pci_dirs(pf)]
    pods = [netns(), netns()]
    ipam = {"type": "sriov-ipam", "dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "10.81.0.0/24"}]]}
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "rdmanet",
        "type": "sriov",
        "pfNames": [pf],
        "dataDir": str(tmp_path),
        "rdma": "soft",
        "ipam": ipam,
    }
    addresses = []
    infos = [tmp_path / f"devinfo-{i}.json" for i in range(len(pods))]
    confs = [dict(conf, runtimeConfig={"CNIDeviceInfoFile": str(info)}) for info in infos]
    for i, pod in enumerate(pods):
        rc, res = cni("ADD", confs[i], container=f"rdma{i}", netns=ns_path(pod))
        assert rc == 0, res
        addresses.append(res["ips"][0]["address"].split("/")[0])
    for pod in pods:
        sriov.wait_carrier("net1", pod)
    devices = [soft_name(p) for p in vf_pcis]
    if exclusive:
        # Each pod sees its own device, and the host neither.
        assert [rdma_devs_in(pod) for pod in pods] == [[d] for d in devices]
        assert rdma_devs() == []
    else:
        assert sorted(rdma_devs()) == sorted(devices)
    # What each pod is told (its device-info file), checked against the GID
    # table read in the pod by the shell; the traffic below runs with it.
    told = [json.loads(info.read_text())["pci"] for info in infos]
    assert [t["rdma-device"] for t in told] == devices
    gids = [int(t["rdma-gid-index"]) for t in told]
    oracle = [roce_v2_gid_index(p, d, a) for p, d, a in zip(pods, devices, addresses, strict=True)]
    assert gids == oracle
    print(f"devices {devices}, addresses {addresses}, RoCE v2 GID indexes told {gids}")

    exported_before = exported_packets(url)
    # ibv_rc_pingpong sleeps on completion events (-e) rather than polling:
    # rxe does its work in the guest kernel, on the vCPUs the tools run on,
    # and a guest's vCPUs take turns on one host thread, so two polling
    # tools leave it a third of the time.  ib_write_bw has no event mode:
    # its server only waits in the kernel; the client alone polls.  The
    # messages are 4 KiB: traffic is proven by a few hundred of any size.
    for order in (pods, pods[::-1]):
        first = 0 if order == pods else 1
        a, b = first, 1 - first
        counters = [(order[0] if exclusive else None, devices[a]), (order[1] if exclusive else None, devices[b])]
        bw = ["ib_write_bw", "-F", "-n", "200", "-s", "4096", "--report_gbits"]
        srv_out, cli_out = run_pair(
            order,
            counters,
            [*bw, "-d", devices[a], "-x", str(gids[a])],
            [*bw, "-d", devices[b], "-x", str(gids[b]), addresses[a]],
            IB_WRITE_BW_PORT,
        )
        print(f"ib_write_bw, server {pods[a]}, client {pods[b]}:\n{cli_out}")
        assert "BW average" in cli_out
        pp = ["ibv_rc_pingpong", "-e", "-n", "100", "-p", str(PINGPONG_PORT)]
        srv_out, cli_out = run_pair(
            order,
            counters,
            [*pp, "-d", devices[a], "-g", str(gids[a])],
            [*pp, "-d", devices[b], "-g", str(gids[b]), addresses[a]],
            PINGPONG_PORT,
        )
        print(f"ibv_rc_pingpong, server {pods[a]}, client {pods[b]}:\n{cli_out}")
        assert "100 iters" in cli_out and "100 iters" in srv_out
        if not exclusive:
            _rdma_cm(order, counters, devices[a], devices[b], addresses[a])
    # Each pod's device counters, as the exporter reads them (inside the pod
    # in exclusive mode; the pod label is the container's, CNI_ARGS naming
    # none): each pod wrote 200 messages and received 200, and sent and
    # received 100 ping-pong messages each way, one packet each at least.
    exported = exported_packets(url)
    print(f"exported rxe packet counters before {exported_before}, after {exported}")
    for pod in ("rdma0", "rdma1"):
        for counter in ("sent_pkts", "rcvd_pkts"):
            assert exported[(pod, counter)] - exported_before[(pod, counter)] >= 200 + 2 * 100, (pod, counter)

    for i, pod in enumerate(pods):
        rc, res = cni("DEL", confs[i], container=f"rdma{i}", netns=ns_path(pod))
        assert rc == 0, res
    assert rdma_devs() == []
    assert not any(info.exists() for info in infos)
    assert records(tmp_path) == []
