"""Per-attachment series: the VF's counters as its PF reports them, and its RDMA port's, by namespace and pod.

A veth cannot report IFLA_VF_STATS, so three oracles stand in for a PF:
pyroute2's own encoder writes the answer the parser reads (and the
running kernel answers for a link without VFs); the collector is run on
records in a real store with a fake reader; the daemon's exporter reads a
JSON file (``FileVfStats``) through the whole path a scrape takes.  The
igb guest runs it on a real PF (tests/vm/test_pod_counters_igb.py).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.core import Metric
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from sriov_cni.daemon import metrics
from sriov_cni.kernel import netlink, rdmacounters, rtnl, vfcontrol
from sriov_cni.kernel.netns import NamespaceError
from sriov_cni.kernel.rtnl import Rtnl
from sriov_cni.kernel.vfsettings import VfStats
from sriov_cni.vfstore import Allocation, FileStore
from tests.support.daemonlib import REPO
from tests.support.metricsrig import PROMTOOL, RULES, Rig, Samples, key

DASHBOARD = REPO / "deploy" / "monitoring" / "grafana-pod-traffic.json"


# --- parsing the kernel's answer ------------------------------------------------


def pf_answer(vfs: dict[int, dict[str, int]], *, stats: bool = True) -> bytes:
    """A PF's RTM_NEWLINK answer as pyroute2's encoder writes it: each VF's MAC, and its counters unless not ``stats``."""
    infos = []
    for vf, counters in vfs.items():
        attrs: list[Any] = [["IFLA_VF_MAC", {"vf": vf, "mac": f"02:00:00:00:00:{vf:02x}"}]]
        attrs.append(["IFLA_VF_SPOOFCHK", {"vf": vf, "spoofchk": 1}])
        if stats:
            named = [[f"IFLA_VF_STATS_{name.upper()}", value] for name, value in counters.items()]
            attrs.append(["IFLA_VF_STATS", {"attrs": [*named, ["IFLA_VF_STATS_PAD", 0]]}])
        infos.append(["IFLA_VF_INFO", {"attrs": attrs}])
    msg = ifinfmsg()
    msg["header"]["type"] = RTM_NEWLINK
    msg["index"] = 7
    msg["attrs"] = [["IFLA_IFNAME", "pf0"], ["IFLA_VFINFO_LIST", {"attrs": infos}]]
    msg.encode()
    return bytes(msg.data)


def test_vf_counters_are_read_from_the_pfs_answer_by_vf_index() -> None:
    full = {
        "rx_packets": 11,
        "tx_packets": 12,
        "rx_bytes": 10_000_000_000,
        "tx_bytes": 2**63 + 5,
        "broadcast": 3,
        "multicast": 4,
        "rx_dropped": 5,
        "tx_dropped": 6,
    }
    answer = pf_answer({0: full, 3: {"rx_bytes": 1}})
    # The oracle: pyroute2's decoder reads the same bytes.
    decoded = ifinfmsg(answer)
    decoded.decode()
    vfinfo = decoded.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")[0]
    assert vfinfo.get_attr("IFLA_VF_STATS").get_attr("IFLA_VF_STATS_TX_BYTES") == 2**63 + 5
    assert vfcontrol.vf_stats(answer) == {0: VfStats(**full), 3: VfStats(rx_bytes=1)}
    # Asked with RTEXT_FILTER_SKIP_STATS (the plugin's read), the kernel leaves them out: no VF then.
    assert vfcontrol.vf_stats(pf_answer({0: full}, stats=False)) == {}


class Recording(socket.socket):
    """A netlink socket that keeps what it sent."""

    sent: list[bytes]

    def send(self, data: Any, flags: int = 0) -> int:
        self.sent.append(bytes(data))
        return super().send(data, flags)


def ext_mask(request: bytes) -> int:
    attrs = netlink_attrs(request)
    [mask] = attrs[rtnl.numbers(ifinfmsg)["IFLA_EXT_MASK"]]
    return int.from_bytes(mask[:4], "little")


def netlink_attrs(request: bytes) -> dict[int, list[memoryview]]:
    # A request has the answer's layout (struct nlmsghdr, ifinfmsg, attributes).
    as_answer = bytearray(request)
    as_answer[4:6] = RTM_NEWLINK.to_bytes(2, "little")
    return rtnl.attributes(bytes(as_answer))


def test_the_kernel_answers_the_metrics_read_with_counters_asked_for_and_the_plugins_without(tmp_path: Path) -> None:
    subprocess.run(["ip", "link", "add", "pfx0", "type", "veth", "peer", "name", "pfx1"], check=True)
    try:
        sock = Recording(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
        sock.sent = []
        reader = vfcontrol.KernelVfStats(Rtnl(sock))
        # The running kernel's answer for a link without VFs: no counters, no failure.
        assert reader.vf_stats("pfx0") == {}
        with pytest.raises(netlink.LinkNotFound, match="PF nosuchpf not found"):
            reader.vf_stats("nosuchpf")
        reader.close()
        assert [ext_mask(r) for r in sock.sent] == [vfcontrol.RTEXT_FILTER_VF] * 2
        # The plugin's read stays as it was: the counters skipped.
        control = vfcontrol.KernelVfControl()
        recording = Recording(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)
        recording.sent = []
        control._rtnl = Rtnl(recording)
        assert control.vfs("pfx0") == {}
        control.close()
        assert [ext_mask(r) for r in recording.sent] == [vfcontrol.RTEXT_FILTER_VF | vfcontrol.RTEXT_FILTER_SKIP_STATS]
    finally:
        subprocess.run(["ip", "link", "del", "pfx0"], check=False)


# --- the collector, on a real store ---------------------------------------------


class CountingReader:
    def __init__(self, table: dict[str, dict[int, VfStats] | None]) -> None:
        self.table = table
        self.asked: list[str] = []
        self.closed = 0

    def vf_stats(self, pf: str) -> dict[int, VfStats]:
        self.asked.append(pf)
        found = self.table[pf]
        if found is None:
            raise netlink.LinkNotFound(f"PF {pf} not found")
        return found

    def close(self) -> None:
        self.closed += 1


def record(pf: str, vf: int, pod: str = "", namespace: str = "", **more: Any) -> Allocation:
    return Allocation(
        vf_pci=f"0000:{pf[-1]}1:10.{vf}",
        pf_pci=f"0000:{pf[-1]}1:00.0",
        pf_netdev=pf,
        vf_index=vf,
        network="fast",
        container_id=f"c0ffee{vf:02d}{pf}" + "0" * 52,
        ifname="net1",
        netns=f"/var/run/netns/pod{vf}",
        netns_inode=None,
        pod_namespace=namespace,
        pod_name=pod,
        **more,
    )


def samples(metrics: Iterator[Metric]) -> Samples:
    return {key(s.name, **s.labels): s.value for m in metrics for s in m.samples}


def sources(reader: CountingReader, mode: str | None = None, **more: Any) -> metrics.Sources:
    return metrics.Sources(lambda: reader, lambda: mode, **more)


def test_each_attachment_has_its_vfs_counters_labelled_by_pod_with_one_read_per_pf(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for alloc in (
        record("ens1", 0, "web-1", "shop"),
        record("ens1", 2, "web-2", "shop"),
        record("ens1", 5),  # a runtime that names no pod
        record("ens2", 1, "db-0", "data"),
        record("ens3", 0, "lost-0", "data"),
    ):
        store.put(alloc)
    reader = CountingReader(
        {
            "ens1": {0: VfStats(rx_bytes=100, tx_bytes=200, rx_packets=1), 2: VfStats(rx_dropped=7), 5: VfStats()},
            # VF 1 is not the PF's now (sriov_numvfs lowered): no series for it.
            "ens2": {0: VfStats(rx_bytes=9)},
            "ens3": None,
        }
    )
    got = samples(metrics.attachments(tmp_path / "sys", tmp_path, sources(reader)))
    assert sorted(reader.asked) == ["ens1", "ens2", "ens3"] and reader.closed == 1
    web1 = {
        "namespace": "shop",
        "pod": "web-1",
        "interface": "net1",
        "network": "fast",
        "pf": "ens1",
        "vf": "0000:11:10.0",
    }
    assert got[key("sriov_cni_pod_vf_receive_bytes_total", **web1)] == 100
    assert got[key("sriov_cni_pod_vf_transmit_bytes_total", **web1)] == 200
    assert got[key("sriov_cni_pod_vf_receive_packets_total", **web1)] == 1
    web2 = dict(web1, pod="web-2", vf="0000:11:10.2")
    assert got[key("sriov_cni_pod_vf_receive_dropped_packets_total", **web2)] == 7
    anonymous = dict(web1, namespace="", pod="c0ffee05ens1", vf="0000:11:10.5")
    assert got[key("sriov_cni_pod_vf_transmit_bytes_total", **anonymous)] == 0
    pods = {dict(k[1])["pod"] for k in got if k[0] == "sriov_cni_pod_vf_receive_bytes_total"}
    assert pods == {"web-1", "web-2", "c0ffee05ens1"}
    up = {dict(k[1])["pf"]: v for k, v in got.items() if k[0] == "sriov_cni_pf_vf_stats_up"}
    assert up == {"ens1": 1, "ens2": 1, "ens3": 0}
    # Eight counters for each of the three attachments whose PF answered, and nothing else per pod.
    per_pod = [k for k in got if k[0].startswith("sriov_cni_pod_")]
    assert len(per_pod) == 8 * 3
    # An attachment's series go with its record.
    store.remove("0000:11:10.0")
    after = samples(metrics.attachments(tmp_path / "sys", tmp_path, sources(CountingReader(reader.table))))
    assert not any(dict(k[1]).get("pod") == "web-1" for k in after)


def rdma_tree(tmp_path: Path, device: str) -> Path:
    """A sysfs with ``device``'s port 1 as mlx5 shows it on RoCE, plus an unreadable counter."""
    sys_root = tmp_path / "sys"
    port = sys_root / "class" / "infiniband" / device / "ports" / "1"
    values = {"port_xmit_data": 250, "port_rcv_data": 1000, "port_xmit_packets": 3, "port_rcv_packets": 4}
    for group, counters in (("counters", values), ("hw_counters", {"rx_write_requests": 9, "np_cnp_sent": 2})):
        (port / group).mkdir(parents=True)
        for name, value in counters.items():
            (port / group / name).write_text(f"{value}\n")
    (port / "hw_counters" / "lifespan").mkdir()  # a directory: no counter
    (port / "counters" / "unreadable").write_text("N/A\n")
    return sys_root


def test_an_rdma_attachments_port_counters_are_read_in_the_host_in_shared_mode(tmp_path: Path) -> None:
    sys_root = rdma_tree(tmp_path, "mlx5_3")
    FileStore(tmp_path).put(record("ens1", 3, "train-0", "ml", rdma_device="mlx5_3"))
    reader = CountingReader({"ens1": {3: VfStats()}})
    got = samples(metrics.attachments(sys_root, tmp_path, sources(reader, "shared")))
    labels = {
        "namespace": "ml",
        "pod": "train-0",
        "interface": "net1",
        "network": "fast",
        "pf": "ens1",
        "vf": "0000:11:10.3",
        "device": "mlx5_3",
        "port": "1",
    }
    # The data counters count 4-byte words.
    assert got[key("sriov_cni_pod_rdma_transmit_bytes_total", **labels)] == 1000
    assert got[key("sriov_cni_pod_rdma_receive_bytes_total", **labels)] == 4000
    assert got[key("sriov_cni_pod_rdma_receive_packets_total", **labels)] == 4
    raw = {
        (dict(k[1])["group"], dict(k[1])["counter"]): v
        for k, v in got.items()
        if k[0] == "sriov_cni_pod_rdma_port_counter"
    }
    assert raw == {
        ("counters", "port_xmit_data"): 250,
        ("counters", "port_rcv_data"): 1000,
        ("counters", "port_xmit_packets"): 3,
        ("counters", "port_rcv_packets"): 4,
        ("hw_counters", "rx_write_requests"): 9,
        ("hw_counters", "np_cnp_sent"): 2,
    }


def test_in_exclusive_mode_rdma_counters_are_read_in_the_pods_namespace(tmp_path: Path) -> None:
    FileStore(tmp_path).put(record("ens1", 3, "train-0", "ml", rdma_device="mlx5_3"))
    FileStore(tmp_path).put(record("ens1", 4, "gone-0", "ml", rdma_device="mlx5_4"))
    asked: list[tuple[str, Path, str]] = []

    def in_pod(netns: str, sys_root: Path, device: str) -> list[rdmacounters.PortCounter]:
        asked.append((netns, sys_root, device))
        if device == "mlx5_4":
            raise NamespaceError("in network namespace /var/run/netns/pod4: gone", 2)
        return [rdmacounters.PortCounter(1, "counters", "port_rcv_data", 5)]

    def in_host(sys_root: Path, device: str) -> list[rdmacounters.PortCounter]:
        raise AssertionError("read in the host in exclusive mode")

    reader = CountingReader({"ens1": {3: VfStats(), 4: VfStats()}})
    got = samples(
        metrics.attachments(
            tmp_path / "sys", tmp_path, sources(reader, "exclusive", rdma_in_pod=in_pod, rdma_in_host=in_host)
        )
    )
    assert asked == [
        ("/var/run/netns/pod3", tmp_path / "sys", "mlx5_3"),
        ("/var/run/netns/pod4", tmp_path / "sys", "mlx5_4"),
    ]
    received = {dict(k[1])["pod"]: v for k, v in got.items() if k[0] == "sriov_cni_pod_rdma_receive_bytes_total"}
    # The pod whose namespace could not be entered has its VF's series, not its port's.
    assert received == {"train-0": 20}
    gone = {"namespace": "ml", "pod": "gone-0", "interface": "net1", "network": "fast", "pf": "ens1"}
    assert key("sriov_cni_pod_vf_receive_bytes_total", **gone, vf="0000:11:10.4") in got


def test_port_counters_are_read_inside_a_namespace_from_its_own_sysfs(tmp_path: Path) -> None:
    # No RDMA device on this kernel: the namespace's own sysfs is mounted,
    # read (nothing listed) and gone with the child; the caller's is untouched.
    name = f"rdmacnt-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        sys_root = rdma_tree(tmp_path, "mlx5_0")
        assert rdmacounters.read_in_netns(f"/var/run/netns/{name}", sys_root, "mlx5_0") == []
        assert len(rdmacounters.read(sys_root, "mlx5_0")) == 6
        with pytest.raises(NamespaceError):
            rdmacounters.read_in_netns(f"/var/run/netns/{name}-none", sys_root, "mlx5_0")
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


# --- through the daemon's exporter ----------------------------------------------


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, f"vfstats={tmp_path / 'vfstats.json'}", f"vfstats_log={tmp_path / 'vfstats.log'}")
    yield r
    r.close()


def pod_series(samples: Samples, pod: str) -> dict[str, float]:
    return {k[0]: v for k, v in samples.items() if dict(k[1]).get("pod") == pod}


def test_the_daemon_serves_each_pods_vf_counters_until_its_del(rig: Rig, tmp_path: Path) -> None:
    pf = rig.pfs[0].name
    env = rig.env

    def with_pod(command: str, pod: int) -> dict[str, str]:
        return dict(env(command, pod), CNI_ARGS=f"K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-{pod};K8S_POD_UID=u{pod}")

    rig.env = with_pod  # type: ignore[method-assign]
    for pod in (0, 1):
        rc, out = rig.call("ADD", pod, rig.conf())
        assert rc == 0, out
    records = {a.pod_name: a for a in FileStore(rig.state).scan()[0]}
    (tmp_path / "vfstats.json").write_text(
        json.dumps({pf: {str(records["web-0"].vf_index): {"rx_bytes": 10_000_000, "tx_bytes": 20_000_000}}})
    )
    log = tmp_path / "vfstats.log"
    log.write_text("")
    first = rig.scrape()
    # Two attachments on one PF: one read of that PF, whatever their number.
    assert log.read_text().split() == [pf]
    web0 = pod_series(first, "web-0")
    assert web0["sriov_cni_pod_vf_receive_bytes_total"] == 10_000_000
    assert web0["sriov_cni_pod_vf_transmit_bytes_total"] == 20_000_000
    assert set(pod_series(first, "web-1").values()) == {0}
    labels = {dict(k[1])["pod"]: dict(k[1]) for k in first if k[0] == "sriov_cni_pod_vf_receive_bytes_total"}
    assert labels["web-0"] == {
        "namespace": "shop",
        "pod": "web-0",
        "interface": "net1",
        "network": "net-a",
        "pf": pf,
        "vf": records["web-0"].vf_pci,
    }
    rc, out = rig.call("DEL", 0, rig.conf())
    assert rc == 0, out
    after = rig.scrape()
    assert pod_series(after, "web-0") == {}
    assert set(pod_series(after, "web-1")) == {name + "_total" for name, _ in metrics.VF_COUNTERS.values()}
    assert after[key("sriov_cni_pf_vf_stats_up", pf=pf)] == 1


# --- the dashboard and the recording rules --------------------------------------

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def served_names(rig: Rig) -> set[str]:
    """What the exporter serves: a scrape's names, and the RDMA families' (no RDMA device on this host)."""
    names = {k[0] for k in rig.scrape()}
    names |= {name + "_total" for _, _, name, _ in metrics.RDMA_NAMED} | {"sriov_cni_pod_rdma_port_counter"}
    return names


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL expression in a Grafana dashboard: its targets' ``expr`` and its query variables' queries."""
    if isinstance(node, dict) and node.get("type") == "datasource":
        return  # a data source variable's "query" is the data source's type
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            elif k == "query" and isinstance(v, str):
                yield v
            elif k == "query" and isinstance(v, dict) and isinstance(v.get("query"), str):
                yield v["query"]
            else:
                yield from expressions(v)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def metric_names(expr: str) -> set[str]:
    """The metric names in ``expr``: the exporter's (``sriov_cni_``) and recorded ones (``...:sriov_cni_...:...``)."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    return {n for n in NAME.findall(expr) if "sriov_cni_" in n}


def test_the_dashboard_and_the_recording_rules_name_only_metrics_the_exporter_serves(rig: Rig) -> None:
    rc, out = rig.call("ADD", 0, rig.conf())
    assert rc == 0, out
    served = served_names(rig)
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    recorded = {r["record"]: r["expr"] for r in rules if "record" in r}
    assert recorded, "no recording rules"
    for name, expr in recorded.items():
        assert metric_names(expr) <= served, (name, metric_names(expr) - served)
    dashboard = json.loads(DASHBOARD.read_text())
    found = list(expressions(dashboard))
    assert len(found) >= 5, found
    used: set[str] = set()
    for expr in found:
        names = metric_names(expr)
        assert names, expr
        assert names <= served | set(recorded), (expr, names - served - set(recorded))
        used |= names
    # Every recorded series is drawn somewhere.
    assert set(recorded) <= used


def test_the_recording_rules_compute_per_pod_rates(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.fail("Debian's prometheus package is not installed: tests/setup-host.sh installs it")
    vf = 'namespace="shop",pod="web-0",interface="net1",network="fast",pf="ens1",vf="0000:11:10.0"'
    node = 'instance="node1:9731",job="sriov-cni"'
    cases = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # 6 MB a minute received: 100 kB/s.
                    {"series": f"sriov_cni_pod_vf_receive_bytes_total{{{vf},{node}}}", "values": "0+6000000x10"},
                    {"series": f"sriov_cni_pod_vf_transmit_bytes_total{{{vf},{node}}}", "values": "0x10"},
                ],
                "promql_expr_test": [
                    {
                        "expr": "namespace_pod_interface:sriov_cni_pod_vf_receive_bytes:rate5m",
                        "eval_time": "10m",
                        "exp_samples": [
                            {
                                "labels": "namespace_pod_interface:sriov_cni_pod_vf_receive_bytes:rate5m"
                                '{namespace="shop",pod="web-0",interface="net1",network="fast"}',
                                "value": 100000,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "rates-test.yaml"
    path.write_text(yaml.safe_dump(cases))
    run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
