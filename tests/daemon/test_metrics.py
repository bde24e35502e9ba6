"""The daemon's Prometheus metrics: calls counted as their callers saw them, the pool as status shows it.

The node is the host fixtures (veth ends as VFs in a temporary sysfs, the PF
side faked in the daemon: tests/support/hostnode.py); calls go through the
static shim.  The pool's oracle is ``sriov-cni status --json`` run here on
the same tree; the calls' oracle is what each caller read.  Last, Debian's
Prometheus scrapes the daemon and loads the README's alert rules.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sriov_cni import __version__, cli
from sriov_cni.daemon import budget
from sriov_cni.vfstore import FileStore, SetAside
from tests.support.daemonlib import command_line, exporter_of, wait_for
from tests.support.metricsrig import RULES, Rig, Samples, key

POOL = {
    "sriov_cni_pf_vfs",
    "sriov_cni_pf_vfs_max",
    "sriov_cni_vfs",
    "sriov_cni_vfs_dpdk",
    "sriov_cni_allocations",
    "sriov_cni_rdma_netns_mode",
    "sriov_cni_rdma_devices",
    "sriov_cni_vf_set_aside_failures",
}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.close()


def status_json(rig: Rig) -> dict[str, Any]:
    """``sriov-cni status --json`` here, on the rig's sysfs tree, as the rig's daemon sees it."""
    result = CliRunner().invoke(cli.main, ["status", "--json", "--data-dir", str(rig.state)], obj=rig.node.node.paths)
    assert result.exit_code == 0, result.output
    status: dict[str, Any] = json.loads(result.output)
    return status


def expected_pool(status: dict[str, Any]) -> Samples:
    """The pool series status' records call for, counted here."""
    out: Samples = {}
    pfs: list[dict[str, Any]] = status["pfs"]
    if status["rdmaNetnsMode"] is not None:
        for mode in ("exclusive", "shared"):
            out[key("sriov_cni_rdma_netns_mode", mode=mode)] = float(mode == status["rdmaNetnsMode"])
    for pf in pfs:
        labels = {"pf": pf["netdev"], "pci": pf["pci"]}
        out[key("sriov_cni_pf_vfs", **labels)] = pf["numVfs"]
        out[key("sriov_cni_pf_vfs_max", **labels)] = pf["totalVfs"]
        states = Counter(vf["state"] for vf in pf["vfs"])
        for state in ("free", "allocated", "stale", "giving back", "in use", "set aside", "unreadable record"):
            out[key("sriov_cni_vfs", **labels, state=state)] = states[state]
        for vf in pf["vfs"]:
            if vf["setAside"] is not None:
                reason = vf["setAside"]["reason"]
                out[key("sriov_cni_vf_set_aside_failures", **labels, vf=vf["pci"], reason=reason)] = vf["setAside"][
                    "failures"
                ]
        out[key("sriov_cni_vfs_dpdk", **labels)] = sum(vf["driver"] == "vfio-pci" for vf in pf["vfs"])
        owners = Counter((vf["allocation"]["network"], vf["state"]) for vf in pf["vfs"] if vf["allocation"])
        for (network, state), count in owners.items():
            out[key("sriov_cni_allocations", **labels, network=network, state=state)] = count
        wheres = Counter(vf["rdmaWhere"] for vf in pf["vfs"] if vf["rdmaWhere"] is not None)
        for where, count in wheres.items():
            out[key("sriov_cni_rdma_devices", **labels, where=where)] = count
    return out


def pool_of(samples: Samples) -> Samples:
    return {k: v for k, v in samples.items() if k[0] in POOL}


def calls(samples: Samples, program: str, command: str, result: str) -> float:
    return samples.get(key("sriov_cni_calls_total", program=program, command=command, result=result), 0.0)


def durations(samples: Samples, program: str, command: str) -> tuple[float, float]:
    """The histogram's count and sum; its +Inf bucket must hold every call."""
    labels = {"program": program, "command": command}
    count = samples.get(key("sriov_cni_call_duration_seconds_count", **labels), 0.0)
    assert samples.get(key("sriov_cni_call_duration_seconds_bucket", **labels, le="+Inf"), 0.0) == count
    return count, samples.get(key("sriov_cni_call_duration_seconds_sum", **labels), 0.0)


def settled(rig: Rig, want: Any) -> Samples:
    """A scrape once ``want(samples)`` holds: a child reports its call just after answering it."""

    def probe() -> Samples:
        samples = rig.scrape()
        return samples if want(samples) else {}

    return wait_for(probe)


def test_calls_are_counted_by_command_and_the_code_each_caller_got(rig: Rig) -> None:
    before = rig.scrape()
    assert before[key("sriov_cni_build_info", version=__version__)] == 1
    assert before[key("sriov_cni_daemon_up")] == 1
    rc, out = rig.call("ADD", 0, rig.conf())
    assert rc == 0, out
    rc, bad = rig.call("ADD", 1, b'{"cniVersion": "1.0.0", "name": "n", "type": "sriov", "vlan": 5000}')
    assert rc == 1 and bad["code"] == 7, bad
    rc, out = rig.call("DEL", 0, rig.conf())
    assert rc == 0, out
    rc, out = rig.call("VERSION", 0, b'{"cniVersion": "1.0.0"}')
    assert rc == 0, out
    # A command no runtime sends is counted, under "other", not as a series of its own.
    rc, odd = rig.call("FROBNICATE", 0, rig.conf())
    assert rc == 1, odd
    expected = {("ADD", "0"): 1, ("ADD", "7"): 1, ("DEL", "0"): 1, ("VERSION", "0"): 1, ("other", str(odd["code"])): 1}
    ended = key("sriov_cni_daemon_children_ended_total", how="after_calls")
    # Counted once the children have reported their calls, and the daemon
    # has reaped the ones that served their two (it does so just after).
    after = settled(
        rig,
        lambda s: (
            sum(calls(s, "sriov", c, r) - calls(before, "sriov", c, r) for c, r in expected) == len(expected)
            and s.get(ended, 0) >= 2
        ),
    )
    for (command, result), count in expected.items():
        assert calls(after, "sriov", command, result) - calls(before, "sriov", command, result) == count
    for command, count in (("ADD", 2), ("DEL", 1), ("VERSION", 1), ("other", 1)):
        n0, s0 = durations(before, "sriov", command)
        n1, s1 = durations(after, "sriov", command)
        assert n1 - n0 == count and s1 > s0, command
    assert not any(k[0] == "sriov_cni_calls_total" and ("command", "FROBNICATE") in k[1] for k in after)
    # Five calls, two per child: children ended after their calls and
    # were replaced; none ran a call when it ended.
    assert after[ended] >= 2
    assert after.get(key("sriov_cni_daemon_children_ended_total", how="in_call"), 0) == 0
    assert after[key("sriov_cni_daemon_children", state="running")] == 0


def test_a_call_whose_child_is_killed_counts_as_the_code_its_caller_got(rig: Rig) -> None:
    before = rig.scrape()
    env = dict(rig.env("ADD", 2), CNI_CONTAINERID="killed")
    # The child waits for the rest of stdin until it is killed.
    proc = subprocess.Popen([str(rig.bin / "sriov-ipam")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    [child] = wait_for(rig.running)
    during = rig.scrape()
    assert during[key("sriov_cni_daemon_children", state="running")] == 1
    os.kill(child, signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    answer = json.loads(out)
    assert proc.returncode == 1 and answer["code"] == 11 and "ended without an answer" in answer["msg"], answer
    after = settled(rig, lambda s: calls(s, "sriov-ipam", "ADD", "11") > calls(before, "sriov-ipam", "ADD", "11"))
    assert calls(after, "sriov-ipam", "ADD", "11") - calls(before, "sriov-ipam", "ADD", "11") == 1
    assert durations(after, "sriov-ipam", "ADD")[0] - durations(before, "sriov-ipam", "ADD")[0] == 1
    ended = key("sriov_cni_daemon_children_ended_total", how="in_call")
    assert after[ended] - before.get(ended, 0) == 1
    assert after[key("sriov_cni_daemon_children", state="running")] == 0
    # The daemon serves on, and counts on.
    rc, out2 = rig.call("VERSION", 0, b'{"cniVersion": "1.0.0"}', program="sriov-ipam")
    assert rc == 0, out2
    settled(rig, lambda s: calls(s, "sriov-ipam", "VERSION", "0") == calls(before, "sriov-ipam", "VERSION", "0") + 1)


def test_the_pool_gauges_equal_status_json_before_and_after_adds_and_dels(rig: Rig) -> None:
    def check() -> Samples:
        expected = expected_pool(status_json(rig))
        assert pool_of(rig.scrape()) == expected
        return expected

    pf0 = {"pf": rig.pfs[0].name, "pci": rig.pfs[0].pci}
    pf1 = {"pf": rig.pfs[1].name, "pci": rig.pfs[1].pci}
    # Fixture: an mlx5-like RDMA device on each of pf1's VFs (the tree's
    # sysfs); the host's kernel has no RDMA core, so no mode series and
    # every device counted in the host.
    for vf in rig.pfs[1].vfs:
        (rig.node.node.sys / "bus" / "pci" / "devices" / vf.pci / "infiniband" / f"mlx5_{vf.index}").mkdir(parents=True)
    start = check()
    assert start[key("sriov_cni_rdma_devices", **pf1, where="host")] == 2
    assert start[key("sriov_cni_vfs", **pf0, state="free")] == 3
    assert start[key("sriov_cni_vfs_dpdk", **pf1)] == 1 and start[key("sriov_cni_pf_vfs_max", **pf1)] == 4
    for pod, network in ((0, "net-a"), (1, "net-b"), (2, "net-b")):
        rc, out = rig.call("ADD", pod, rig.conf(network))
        assert rc == 0, out
    full = check()
    assert full[key("sriov_cni_vfs", **pf0, state="free")] == 0
    assert full[key("sriov_cni_allocations", **pf0, network="net-b", state="allocated")] == 2
    # A pod gone without a DEL leaves its VF stale.
    subprocess.run(["ip", "netns", "del", os.path.basename(rig.pods[1])], check=True)
    stale = check()
    assert stale[key("sriov_cni_vfs", **pf0, state="stale")] == 1
    assert stale[key("sriov_cni_allocations", **pf0, network="net-b", state="stale")] == 1
    rc, out = rig.call("DEL", 0, rig.conf("net-a"))
    assert rc == 0, out
    rc, out = rig.call("DEL", 2, rig.conf("net-b"))
    assert rc == 0, out
    end = check()
    assert end[key("sriov_cni_vfs", **pf0, state="free")] == 2
    assert key("sriov_cni_allocations", **pf0, network="net-a", state="allocated") not in end
    assert end[key("sriov_cni_allocations", **pf0, network="net-b", state="stale")] == 1
    # A free VF an ADD set aside (tests/plugin/test_aside.py makes one for real).
    aside_vf = rig.pfs[0].vfs[0].pci
    FileStore(rig.state).set_aside(SetAside(aside_vf, "no carrier", "no carrier 20 s after ...", 1.0, 2.0, 2, 3.0))
    aside = check()
    assert aside[key("sriov_cni_vfs", **pf0, state="set aside")] == 1
    assert aside[key("sriov_cni_vfs", **pf0, state="free")] == 1
    assert aside[key("sriov_cni_vf_set_aside_failures", **pf0, vf=aside_vf, reason="no carrier")] == 2


def said(rig: Rig, words: str) -> str:
    """The next line of the daemon's stderr that has ``words`` (after its warnings, if any)."""
    assert rig.proc.stderr is not None
    line = " "
    while line and words not in line:
        line = rig.proc.stderr.readline()
    return line


def oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def descriptors(pid: int) -> int:
    """How many descriptors ``pid`` holds, TCP connections left out.

    A scrape's connection stays open in the exporter for a moment after the
    scraper has read the answer (the server closes it once the handler
    returns): counting it would make the count depend on who ran first.
    """
    connections = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A":  # anything but a listening socket
                connections.add(f"socket:[{fields[9]}]")
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed since the listing
            continue
        held += target not in connections
    return held


RESTARTS = key("sriov_cni_daemon_exporter_restarts_total")
VERSION = b'{"cniVersion": "1.0.0"}'


def test_a_killed_exporter_is_started_again_on_its_address_with_the_counts_so_far(rig: Rig) -> None:
    rc, out = rig.call("VERSION", 0, VERSION)
    assert rc == 0, out
    before = settled(rig, lambda s: calls(s, "sriov", "VERSION", "0") == 1)
    assert before[RESTARTS] == 0
    daemon, first = rig.proc.pid, exporter_of(rig.proc.pid)
    if oom_score_adj(daemon) != budget.DAEMON_OOM_SCORE_ADJ:
        # Without CAP_SYS_RESOURCE the daemon cannot exempt itself (it says
        # so: test_burst): a value raised here, which needs no privilege,
        # stands in for the exemption a restarted exporter must not keep.
        Path(f"/proc/{daemon}/oom_score_adj").write_text("500")
    # The first was forked before the daemon exempted itself.
    first_score, first_fds = oom_score_adj(first), descriptors(first)
    assert first_score != oom_score_adj(daemon)
    os.kill(first, signal.SIGKILL)
    line = said(rig, "metrics exporter")
    assert f"the metrics exporter on {rig.address} ended" in line and "starting another in 1 s" in line, line
    gap = 0

    def scraped_again() -> Samples:
        # Each try a call first: the daemon serves them while no exporter
        # runs, and while the next one starts.
        nonlocal gap
        rc, out = rig.call("VERSION", 0, VERSION)
        assert rc == 0, out
        gap += 1
        try:
            return rig.scrape()
        except OSError:
            return {}

    wait_for(scraped_again)
    line = said(rig, "metrics exporter")
    assert f"the metrics exporter serves on {rig.url} again" in line, line
    # The call made before the kill, and those made since.
    after = settled(rig, lambda s: calls(s, "sriov", "VERSION", "0") == 1 + gap)
    assert after[RESTARTS] == 1
    assert after[key("sriov_cni_daemon_up")] == 1
    second = exporter_of(daemon)
    assert second != first
    # Forked from the exempt daemon, it set its own back to the first's.
    assert oom_score_adj(second) == first_score != oom_score_adj(daemon)
    # Nothing of the running daemon's (its listener, its children's
    # channels, callers' connections): as many descriptors as the first,
    # forked before there were any.
    wait_for(lambda: descriptors(second) == first_fds)


def _exporter_after(rig: Rig, killed: int) -> int:
    """The pid of the exporter the daemon started after ``killed``."""
    return wait_for(lambda: (pid := exporter_of(rig.proc.pid)) != killed and pid)


def test_an_exporter_that_dies_at_once_is_started_again_later_each_time(rig: Rig) -> None:
    killed = exporter_of(rig.proc.pid)
    for delay in (1, 2, 4):
        os.kill(killed, signal.SIGKILL)
        line = said(rig, "metrics exporter")
        # One line per exporter ended, the back-off doubling while each
        # served less than its maximum.
        assert "ended after" in line and f"starting another in {delay} s" in line, line
        line = said(rig, "metrics exporter")
        assert "serves on" in line and "again" in line, line
        killed = _exporter_after(rig, killed)
    samples = rig.scrape()
    assert samples[RESTARTS] == 3
    rc, out = rig.call("VERSION", 0, VERSION)
    assert rc == 0, out


def test_an_exporter_whose_port_is_taken_is_tried_again_until_it_is_free(rig: Rig) -> None:
    host, port = rig.address.rsplit(":", 1)
    with socket.socket() as taken:
        # Over the killed exporter's closed connections (TIME_WAIT), as it binds.
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        while True:
            os.kill(exporter_of(rig.proc.pid), signal.SIGKILL)
            line = said(rig, "metrics exporter")
            assert f"the metrics exporter on {rig.address} ended" in line, line
            try:
                taken.bind((host, int(port)))
                break
            except OSError as exc:
                # The next exporter came first: killed again, the one after
                # comes later.
                assert exc.errno == errno.EADDRINUSE, exc
                line = said(rig, "metrics exporter")
                assert "serves on" in line, line
        taken.listen()
        line = said(rig, "metrics exporter")
        assert (
            f"could not start again on {rig.address}: cannot listen on {rig.address}: Address already in use" in line
            and "starting another in" in line
        ), line
        rc, out = rig.call("VERSION", 0, VERSION)
        assert rc == 0, out
    # Free again: the attempt under way or the next one listens (a line
    # for each that failed meanwhile).
    while "serves on" not in (line := said(rig, "metrics exporter")):
        assert "could not start again" in line, line
    assert f"serves on {rig.url} again" in line, line
    assert rig.scrape()[key("sriov_cni_daemon_up")] == 1


def test_the_exporter_ends_with_the_daemon(rig: Rig) -> None:
    host, port = rig.address.rsplit(":", 1)
    rig.proc.kill()
    rig.proc.wait(timeout=30)

    def refused() -> bool:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except ConnectionRefusedError:
            return True
        return False

    wait_for(refused)


PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NOT_INSTALLED = "Debian's prometheus package is not installed: tests/setup-host.sh installs it"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_example_alert_rules_are_valid_and_fire_as_the_readme_says(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.fail(NOT_INSTALLED)
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    pf = 'pf="ens1f0",pci="0000:af:00.0",instance="node1:9731",job="sriov-cni"'
    node = 'instance="node1:9731",job="sriov-cni"'
    tests: dict[str, Any] = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"sriov_cni_pf_vfs{{{pf}}}", "values": "8x20"},
                    {"series": f'sriov_cni_vfs{{{pf},state="free"}}', "values": "3 0x19"},
                    {"series": f'sriov_cni_vfs{{{pf},state="stale"}}', "values": "0x20"},
                    {"series": f"up{{{node}}}", "values": "1 1 0x18"},
                    {
                        "series": f'sriov_cni_vf_set_aside_failures{{{pf},vf="0000:af:10.1",reason="no carrier"}}',
                        "values": "1 2 3x60",
                    },
                    {"series": f"sriov_cni_daemon_up{{{node}}}", "values": "1x20"},
                    {
                        "series": f'sriov_cni_calls_total{{{node},program="sriov",command="ADD",result="0"}}',
                        "values": "0+10x20",
                    },
                    {
                        "series": f'sriov_cni_calls_total{{{node},program="sriov",command="ADD",result="101"}}',
                        "values": "0 0 0 0 0+10x16",
                    },
                    {
                        "series": f'sriov_cni_vfs_given_back_total{{{node},reason="netns gone",result="failed"}}',
                        "values": "0x10 1x30",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": "SriovCniPoolExhausted", "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": "SriovCniPoolExhausted",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "pf": "ens1f0",
                                    "pci": "0000:af:00.0",
                                    "instance": "node1:9731",
                                    "job": "sriov-cni",
                                }
                            }
                        ],
                    },
                    {"eval_time": "3m", "alertname": "SriovCniDaemonDown", "exp_alerts": []},
                    {
                        "eval_time": "10m",
                        "alertname": "SriovCniDaemonDown",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "critical", "instance": "node1:9731", "job": "sriov-cni"}}
                        ],
                    },
                    {"eval_time": "20m", "alertname": "SriovCniVfSetAside", "exp_alerts": []},
                    {
                        "eval_time": "40m",
                        "alertname": "SriovCniVfSetAside",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "pf": "ens1f0",
                                    "pci": "0000:af:00.0",
                                    "vf": "0000:af:10.1",
                                    "reason": "no carrier",
                                    "instance": "node1:9731",
                                    "job": "sriov-cni",
                                }
                            }
                        ],
                    },
                    {"eval_time": "8m", "alertname": "SriovCniGiveBackFailed", "exp_alerts": []},
                    {
                        "eval_time": "12m",
                        "alertname": "SriovCniGiveBackFailed",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "reason": "netns gone",
                                    "result": "failed",
                                    "instance": "node1:9731",
                                    "job": "sriov-cni",
                                }
                            }
                        ],
                    },
                    {"eval_time": "30m", "alertname": "SriovCniGiveBackFailed", "exp_alerts": []},
                    {"eval_time": "4m", "alertname": "SriovCniCallErrors", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "SriovCniCallErrors",
                        "exp_alerts": [
                            {"exp_labels": {"severity": "warning", "instance": "node1:9731", "job": "sriov-cni"}}
                        ],
                    },
                ],
            }
        ],
    }
    # promtool compares annotations too: each expected alert's are the rule's, filled in.
    for case in tests["tests"][0]["alert_rule_test"]:
        for alert in case["exp_alerts"]:
            alert["exp_annotations"] = _annotations(case["alertname"], alert["exp_labels"])
    path = tmp_path / "rules-test.yaml"
    path.write_text(yaml.safe_dump(tests))
    run = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def _annotations(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The alert's annotations from the rules file, its templates filled with ``labels``."""
    [rule] = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r.get("alert") == alert]
    out = {}
    for name, template in rule.get("annotations", {}).items():
        for label, value in labels.items():
            template = template.replace("{{ $labels." + label + " }}", value)
        out[name] = template
    return out


def test_prometheus_scrapes_the_pool_and_the_calls(rig: Rig, tmp_path: Path) -> None:
    if PROMETHEUS is None:
        pytest.fail(NOT_INSTALLED)
    rc, out = rig.call("ADD", 0, rig.conf())
    assert rc == 0, out
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "sriov-cni", "static_configs": [{"targets": [rig.address]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("w")
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={web}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def api(path: str, **params: str) -> Any:
        url = f"http://{web}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return json.loads(answer.read())["data"]
        except OSError:
            return None  # not listening yet

    def series(query: str) -> Samples | None:
        data = api("query", query=query)
        if not data or not data["result"]:
            return None
        return {
            key(
                r["metric"].pop("__name__"), **{k: v for k, v in r["metric"].items() if k not in ("instance", "job")}
            ): float(r["value"][1])
            for r in data["result"]
        }

    try:
        expected = expected_pool(status_json(rig))
        names = "|".join(sorted(POOL))
        pool = wait_for(lambda: series(f'{{__name__=~"{names}"}}'))
        assert pool == expected
        assert pool[key("sriov_cni_vfs", pf=rig.pfs[0].name, pci=rig.pfs[0].pci, state="allocated")] == 1
        added = wait_for(lambda: series('sriov_cni_calls_total{command="ADD"}'))
        assert added == {key("sriov_cni_calls_total", program="sriov", command="ADD", result="0"): 1}
        assert wait_for(lambda: series("up")) == {key("up"): 1}

        def rules() -> dict[str, str] | None:
            data = api("rules")
            loaded = {r["name"]: r["health"] for g in data["groups"] for r in g["rules"]} if data else {}
            # "unknown" until the first evaluation.
            return loaded if loaded and "unknown" not in loaded.values() else None

        health = wait_for(rules)
        # The alerts, and the per-pod traffic's recording rules.
        recorded = {
            r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r
        }
        assert health == {
            "SriovCniPoolExhausted": "ok",
            "SriovCniCallErrors": "ok",
            "SriovCniDaemonDown": "ok",
            "SriovCniVfSetAside": "ok",
            "SriovCniGiveBackFailed": "ok",
            **dict.fromkeys(recorded, "ok"),
        }
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=60)
        log.close()


def test_metrics_on_an_address_in_use_or_malformed_stop_the_daemon_saying_why(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for address, why in (
            (f"127.0.0.1:{port}", f"cannot serve metrics: cannot listen on 127.0.0.1:{port}"),
            ("9731", "is not HOST:PORT"),
        ):
            proc = subprocess.run(
                command_line(tmp_path / "run" / "plugin.sock", "--metrics-address", address),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode != 0 and why in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
