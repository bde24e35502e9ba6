"""Hostile and odd input to the ``sriov`` plugin: one regression test per defect found.

Each bad input must get a CNI error object with the right code, no traceback
anywhere, and leave the node exactly as it was (``node.picture()``).
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from sriov_cni import log
from sriov_cni.cni import Code
from sriov_cni.kernel import netlink
from sriov_cni.plugin import commands
from tests.support.pluginlib import (
    Node,
    Outcome,
    Ready,
    ipam_reservations,
    link,
    link_names,
    netdev_view,
    refused,
    run_bin,
    sh,
)


def answered(node: Node, command: str, conf: dict[str, Any], **env: Any) -> Outcome:
    """Run the plugin in a thread; fail (rather than hang the suite) if it does not answer."""
    box: list[Outcome] = []
    worker = threading.Thread(target=lambda: box.append(node.cni(command, conf, **env)), daemon=True)
    worker.start()
    worker.join(60)
    assert box, f"{command} did not answer"
    return box[0]


# --- 1: an ifname the kernel rewrites; rollback and DEL find the VF by PCI ------------


def test_ifname_template_is_refused_before_anything_changes(ready: Ready) -> None:
    node, pod, before = ready
    for name in ("net%d", "n%s", "%d"):
        refused(node.cni("ADD", node.conf(), netns=pod, ifname=name), Code.INVALID_ENV)
    assert node.picture() == before


def test_del_finds_the_vf_in_the_pod_under_another_name(ready: Ready) -> None:
    node, pod, before = ready
    conf = node.conf()
    node.add(conf, netns=pod)
    ns = os.path.basename(pod)
    sh("ip", "-n", ns, "link", "set", "net1", "name", "renamed0")
    # Another interface takes the recorded name: it must not be taken for the VF.
    sh("ip", "-n", ns, "link", "add", "net1", "type", "veth", "peer", "name", "other1")

    res = node.cni("DEL", conf, netns=pod)

    assert res.rc == 0, res.stdout
    assert link_names(ns) >= {"net1", "other1"} and "renamed0" not in link_names(ns)
    assert node.picture()["host"] == before["host"]
    assert node.records() == []


def test_restore_keeps_the_record_when_the_vf_is_nowhere_to_be_found(ready: Ready) -> None:
    node, pod, _ = ready
    conf = node.conf()
    node.add(conf, netns=pod)
    ns = os.path.basename(pod)
    # The VF's netdev gets a MAC and name we never gave it: it cannot be told
    # apart from any other interface, so nothing may be reported as restored.
    sh("ip", "-n", ns, "link", "set", "net1", "address", "02:de:ad:be:ef:01")
    sh("ip", "-n", ns, "link", "set", "net1", "name", "mystery")

    res = node.cni("DEL", conf, netns=pod)

    refused(res, Code.DEVICE)
    assert len(node.records()) == 1


# --- 3: container IDs are full-matched ------------------------------------------------


@pytest.mark.parametrize("container", ["c1\n", "c1\nc2", "\nc1", "c1\r", "-c1", "c1 "])
def test_container_id_with_trailing_newline_is_refused(ready: Ready, container: str) -> None:
    node, pod, before = ready
    conf = node.conf(ipam=node.sriov_ipam())
    refused(node.cni("ADD", conf, netns=pod, container=container), Code.INVALID_ENV)
    assert node.picture() == before
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


# --- 4: no netlink socket leaks from a failed ADD after the move ---------------------


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


def test_failed_add_after_the_move_leaks_no_socket(ready: Ready) -> None:
    node, pod, before = ready
    # IPAM succeeds, then a route through an unreachable gateway fails inside
    # the pod: the rollback runs with the pod's handle already used.
    ipam = node.sriov_ipam("10.48.0.0/24")
    ipam["routes"] = [{"dst": "10.49.0.0/16", "gw": "198.51.100.1"}]
    conf = node.conf(ipam=ipam)
    refused(node.cni("ADD", conf, netns=pod), Code.DEVICE)
    baseline = _sockets()
    for _ in range(3):
        refused(node.cni("ADD", conf, netns=pod), Code.DEVICE)
    assert _sockets() == baseline
    assert node.picture() == before


def test_session_closes_the_handle_a_rollback_opened_after_a_failure() -> None:
    # The shape of a failed ADD: a request on the host handle fails inside an
    # enclosing host block, the rollback opens a fresh host handle, and the
    # failure then leaves the enclosing block too.  The cache used to drop
    # the rollback's handle there without closing it.
    baseline = _sockets()
    with netlink.session():
        with pytest.raises(netlink.LinkNotFound):
            with netlink.open_namespace() as outer:
                with pytest.raises(netlink.LinkNotFound):
                    with netlink.open_namespace() as inner:
                        assert inner is outer
                        inner.get(2**31 - 1)
                with netlink.open_namespace() as fresh:
                    assert fresh is not outer
                    assert fresh.links()
                raise netlink.LinkNotFound("the move failed")
    assert _sockets() == baseline


# --- 5: the host's own namespace as CNI_NETNS ---------------------------------------------


@pytest.mark.parametrize("netns", ["/proc/self/ns/net", "/proc/1/ns/net", f"/proc/{os.getpid()}/ns/net"])
def test_host_namespace_as_netns_is_refused(ready: Ready, netns: str) -> None:
    node, _, before = ready
    conf = node.conf(ipam=node.sriov_ipam())
    refused(node.cni("ADD", conf, netns=netns), Code.INVALID_NETNS)
    assert node.picture() == before
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


# --- 6: FIFOs never hang a call (resolvConf: tests/ipam/test_hostile_ipam.py) ----------------------------------------------


def test_fifo_as_netns_answers(ready: Ready, tmp_path: Path) -> None:
    node, _, before = ready
    fifo = tmp_path / "netns-fifo"
    os.mkfifo(fifo)
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1", "sandbox": str(fifo)}]}
    for command, conf in (("ADD", node.conf()), ("CHECK", node.conf(prevResult=prev))):
        refused(answered(node, command, conf, netns=str(fifo)), Code.INVALID_NETNS)
    assert answered(node, "DEL", node.conf(), netns=str(fifo)).rc == 0
    assert node.picture() == before


@pytest.mark.parametrize("kind", ["fifo", "/dev/full"])
def test_log_file_that_is_no_regular_file_answers_and_logs_to_stderr(
    ready: Ready, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    node, pod, before = ready
    path = kind
    if kind == "fifo":
        path = str(tmp_path / "log-fifo")
        os.mkfifo(path)
    conf = node.conf(logFile=path)
    res = answered(node, "ADD", conf, netns=pod)
    assert res.rc == 0, res.stdout
    err = capsys.readouterr().err
    assert "logging to stderr" in err and "allocated VF" in err
    assert "Traceback" not in err and "Logging error" not in err
    assert answered(node, "DEL", conf, netns=pod).rc == 0
    assert node.picture() == before


# --- 7: unbounded work from small inputs -----------------------------------------------------


@pytest.mark.parametrize("entry", ["#0-3000000", "#0-30000000", "#0-99999999999999999999", "#4000000"])
def test_huge_vf_index_range_is_refused_with_a_short_message(ready: Ready, entry: str) -> None:
    node, pod, before = ready
    pf = node.pfs[0].name
    out = refused(node.cni("ADD", node.conf(pfNames=[pf + entry]), netns=pod), Code.INVALID_CONFIG)
    assert len(json.dumps(out)) < 600
    assert node.picture() == before


def test_index_range_beyond_the_pf_is_refused(ready: Ready) -> None:
    node, pod, before = ready
    pf = node.pfs[0].name
    out = refused(node.cni("ADD", node.conf(pfNames=[f"{pf}#0-60000"]), netns=pod), Code.INVALID_CONFIG)
    assert "sriov_numvfs=2" in out["msg"] and len(out["msg"]) < 300
    assert node.picture() == before


# --- 8: values that used to end in internal errors ---------------------------------------------

PREV = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1"}], "ips": [{"address": "10.0.0.2/24", "interface": 0}]}


def _with(base: dict[str, Any], **keys: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(base)), **keys}


BAD_CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    "dns.nameservers a string": ({"dns": {"nameservers": "10.0.0.1"}}, Code.INVALID_CONFIG),
    "dns.nameservers a number": ({"dns": {"nameservers": 5}}, Code.INVALID_CONFIG),
    "dns.domain a list": ({"dns": {"domain": ["a"]}}, Code.INVALID_CONFIG),
    "prevResult dns.search a string": ({"prevResult": _with(PREV, dns={"search": "x"})}, Code.DECODE),
    "prevResult mtu 1e400": (
        {"prevResult": _with(PREV, interfaces=[{"name": "net1", "mtu": float("inf")}])},
        Code.DECODE,
    ),
    "prevResult route table 2^40": (
        {"prevResult": _with(PREV, routes=[{"dst": "10.1.0.0/16", "table": 2**40}])},
        Code.DECODE,
    ),
    "prevResult ips a string": ({"prevResult": _with(PREV, ips="10.0.0.2/24")}, Code.DECODE),
    "prevResult interfaces of numbers": ({"prevResult": _with(PREV, interfaces=[1, 2])}, Code.DECODE),
    "NUL in dataDir": ({"dataDir": "/var/lib/x\0y"}, Code.INVALID_CONFIG),
    "NUL in logFile": ({"logFile": "/tmp/x\0y"}, Code.INVALID_CONFIG),
    "NUL in deviceID": ({"deviceID": "0000:3b:10.0\0"}, Code.INVALID_CONFIG),
    "newline after deviceID": ({"deviceID": "0000:3b:10.0\n"}, Code.INVALID_CONFIG),
    "NUL in pfNames": ({"pfNames": ["eth\0"]}, Code.INVALID_CONFIG),
    "NUL in ipam.dataDir": (
        {"ipam": {"type": "sriov-ipam", "dataDir": "/x\0", "subnet": "10.9.0.0/24"}},
        Code.INVALID_CONFIG,
    ),
    "NUL in ipam.resolvConf": (
        {"ipam": {"type": "sriov-ipam", "subnet": "10.9.0.0/24", "resolvConf": "/etc/\0"}},
        Code.INVALID_CONFIG,
    ),
}


@pytest.mark.parametrize("keys, code", list(BAD_CONFIGS.values()), ids=list(BAD_CONFIGS))
def test_bad_value_gets_its_code(ready: Ready, keys: dict[str, Any], code: int) -> None:
    node, pod, before = ready
    conf = node.conf(**keys)
    if "ipam" in keys and "dataDir" not in keys["ipam"]:
        conf["ipam"]["dataDir"] = str(node.ipam_dir)
    command = "CHECK" if "prevResult" in keys else "ADD"
    if command == "CHECK":
        conf["cniVersion"] = "1.0.0"
    out = refused(node.cni(command, conf, netns=pod), code)
    assert "\n" not in out["msg"]
    assert node.picture() == before


def test_data_dir_under_a_file_is_an_io_error(ready: Ready, tmp_path: Path) -> None:
    node, pod, before = ready
    (tmp_path / "plain").write_text("")
    refused(node.cni("ADD", node.conf(dataDir=str(tmp_path / "plain" / "data")), netns=pod), Code.IO_FAILURE)
    assert node.picture() == before


def test_non_utf8_ifname_is_an_env_error(ready: Ready) -> None:
    node, pod, before = ready
    ifname = b"net\xff".decode("utf-8", "surrogateescape")
    refused(node.cni("ADD", node.conf(), netns=pod, ifname=ifname), Code.INVALID_ENV)
    assert node.picture() == before


@pytest.mark.parametrize(
    "content",
    ['{"vf_pci": "x", "original": "not an object"}', '{"original": [1]}', "[]", "{" * 5000, "\xff"],
    ids=["original-string", "original-list", "not-an-object", "nested", "not-utf8"],
)
def test_damaged_store_record_is_an_io_error(ready: Ready, content: str) -> None:
    node, pod, _ = ready
    conf = node.conf()
    node.add(conf, netns=pod)
    [record] = (node.data_dir / "vfs").glob("*.json")
    record.write_bytes(content.encode("latin-1") if content == "\xff" else content.encode())
    for command in ("DEL", "ADD"):
        refused(node.cni(command, conf, netns=node.pod(), container="other"), Code.IO_FAILURE)


def test_a_del_that_fails_on_its_store_still_waits_for_its_ipam(ready: Ready, tmp_path: Path) -> None:
    # The IPAM DEL runs beside the VF's release: however that ends, the
    # answer waits for it, or it would finish beside the runtime's next ADD.
    node, pod, _ = ready
    node.add(node.conf(), netns=pod)
    [record] = (node.data_dir / "vfs").glob("*.json")
    record.write_text("[]")
    bin_dir = tmp_path / "cni-bin"
    bin_dir.mkdir()
    done = tmp_path / "ipam-del-done"
    slow = bin_dir / "slow-ipam"
    slow.write_text(f"#!/bin/sh\nsleep 1\ntouch {done}\n")
    slow.chmod(0o755)
    refused(node.cni("DEL", node.conf(ipam={"type": "slow-ipam"}), netns=pod, path=str(bin_dir)), Code.IO_FAILURE)
    assert done.exists()


def test_store_record_that_is_a_directory_is_an_io_error(ready: Ready) -> None:
    node, pod, _ = ready
    vfs = node.data_dir / "vfs"
    vfs.mkdir(parents=True, mode=0o700)
    node.data_dir.chmod(0o700)
    (vfs / f"{node.pfs[0].vfs[0].pci}.json").mkdir()
    before_fds = len(os.listdir("/proc/self/fd"))
    refused(node.cni("ADD", node.conf(), netns=pod), Code.IO_FAILURE)
    assert len(os.listdir("/proc/self/fd")) == before_fds


def _fake_ipam(tmp_path: Path, output: str, rc: int) -> str:
    """A delegated IPAM plugin printing ``output``; returns its CNI_PATH."""
    bin_dir = tmp_path / "cni-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "odd-output").write_text(output)
    exe = bin_dir / "odd-ipam"
    exe.write_text(f"#!/bin/sh\ncat {bin_dir / 'odd-output'}\nexit {rc}\n")
    exe.chmod(0o755)
    return str(bin_dir)


IPAM_OUTPUTS: dict[str, tuple[str, int, int]] = {
    "error code a string": ('{"cniVersion": "1.0.0", "code": "x", "msg": "m"}', 1, Code.IPAM),
    "error code 1e400": ('{"cniVersion": "1.0.0", "code": 1e400, "msg": "m"}', 1, Code.IPAM),
    "error code a list": ('{"cniVersion": "1.0.0", "code": [7], "msg": "m"}', 1, Code.IPAM),
    "error nested deeply": ("[" * 100000, 1, Code.IPAM),
    "result nested deeply": ("[" * 100000, 0, Code.IPAM),
    "result dns.nameservers a string": (
        '{"cniVersion": "1.0.0", "ips": [{"address": "10.5.0.2/24"}], "dns": {"nameservers": "10.0.0.1"}}',
        0,
        Code.DECODE,
    ),
    "result route table 2^40": (
        '{"cniVersion": "1.0.0", "ips": [{"address": "10.5.0.2/24"}],'
        ' "routes": [{"dst": "10.6.0.0/16", "table": 1099511627776}]}',
        0,
        Code.DECODE,
    ),
    "result route mtu 1e400": (
        '{"cniVersion": "1.0.0", "ips": [{"address": "10.5.0.2/24"}], "routes": [{"dst": "10.6.0.0/16", "mtu": 1e400}]}',
        0,
        Code.DECODE,
    ),
}


@pytest.mark.parametrize("output, rc, code", list(IPAM_OUTPUTS.values()), ids=list(IPAM_OUTPUTS))
def test_odd_ipam_output_gets_its_code(ready: Ready, tmp_path: Path, output: str, rc: int, code: int) -> None:
    node, pod, before = ready
    path = _fake_ipam(tmp_path, output, rc)
    out = refused(node.cni("ADD", node.conf(ipam={"type": "odd-ipam"}), netns=pod, path=path), code)
    assert len(out["msg"]) + len(out.get("details", "")) < 1200
    assert node.picture() == before


# --- 9: log context is data, log failures are one line -----------------------------------------


def test_log_context_with_percent_signs_is_data(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("sriov", "info", None, "c%s1", "/run/netns/%(x)s", "net%d")
    logging.getLogger("sriov_cni").info("hello %s", "there")
    err = capsys.readouterr().err
    assert "Logging error" not in err
    assert "containerID=c%s1 netns=/run/netns/%(x)s ifname=net%d] hello there" in err


@pytest.mark.parametrize("program", ["sriov", "sriov-ipam"])
def test_both_executables_log_one_line_format_with_an_rfc3339_time(
    program: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log.configure(program, "info", None, "c1", "/run/netns/p", "net1")
    logging.getLogger("sriov_cni.ipam").warning("range full")
    [line] = capsys.readouterr().err.splitlines()
    stamp, rest = line.split(" ", 1)
    when = datetime.datetime.fromisoformat(stamp)
    assert when.tzinfo is not None and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", stamp)
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 3600
    assert rest == f"WARNING {program} [containerID=c1 netns=/run/netns/p ifname=net1] range full"


def test_reconfiguring_the_log_on_stderr_changes_its_context_and_level(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("sriov_cni")
    log.configure("sriov", "info", None, "first", "/run/netns/a", "net1")
    logger.debug("not shown")
    log.configure("sriov", "debug", None, "second", "/run/netns/b", "net2")
    logger.debug("shown")
    assert len(logger.handlers) == 1
    err = capsys.readouterr().err
    assert "not shown" not in err
    assert "containerID=second netns=/run/netns/b ifname=net2] shown" in err and "first" not in err


def test_failing_log_writes_print_one_line_not_tracebacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("sriov", "info", str(tmp_path / "sriov.log"), "c1", "/run/netns/p", "net1")
    logger = logging.getLogger("sriov_cni")
    [handler] = logger.handlers
    # Every later write fails, as on a full disk.
    os.close(handler.stream.fileno())  # type: ignore[attr-defined]
    for _ in range(3):
        logger.error("line")
    log.configure("sriov", "info", None, "-", "-", "-")
    err = capsys.readouterr().err
    assert err.count("cannot write to the log") == 1
    assert "Traceback" not in err and "Logging error" not in err


def test_non_utf8_netns_with_a_log_file_prints_no_traceback(
    ready: Ready, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, _, before = ready
    log_file = tmp_path / "sriov.log"
    netns = b"/run/netns/\xff".decode("utf-8", "surrogateescape")
    log.configure_from_env("sriov", {"CNI_NETNS": netns, "CNI_IFNAME": "net1", "CNI_CONTAINERID": "c1"})
    for command in ("ADD", "DEL"):
        res = node.cni(command, node.conf(logFile=str(log_file)), netns=netns)
        assert "Traceback" not in res.stdout + res.stderr
        assert res.rc == 0 or res.code in (Code.INVALID_ENV, Code.INVALID_NETNS)
    assert "Traceback" not in (log_file.read_text() if log_file.exists() else "") + capsys.readouterr().err
    assert node.picture() == before


# --- 10: paths we write as root ----------------------------------------------------------------


@pytest.mark.parametrize("key", ["dataDir", "logFile", "ipam.dataDir"])
def test_relative_paths_are_refused(ready: Ready, key: str) -> None:
    node, pod, before = ready
    conf = node.conf(ipam=node.sriov_ipam())
    if key == "ipam.dataDir":
        conf["ipam"]["dataDir"] = "relative/ipam"
    else:
        conf[key] = "relative/path"
    out = refused(node.cni("ADD", conf, netns=pod), Code.INVALID_CONFIG)
    assert key in out["msg"]
    assert node.picture() == before
    assert not Path("relative").exists()


@pytest.mark.parametrize("where", ["dataDir", "dataDir parent", "ipam network dir", "ipam dataDir"])
def test_symlinked_state_directories_are_not_followed(ready: Ready, tmp_path: Path, where: str) -> None:
    node, pod, before = ready
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    conf = node.conf(ipam=node.sriov_ipam())
    if where == "dataDir":
        os.symlink(target, tmp_path / "linked")
        conf["dataDir"] = str(tmp_path / "linked")
    elif where == "dataDir parent":
        os.symlink(target, tmp_path / "linked")
        conf["dataDir"] = str(tmp_path / "linked" / "data")
    elif where == "ipam dataDir":
        os.symlink(target, tmp_path / "linked")
        conf["ipam"]["dataDir"] = str(tmp_path / "linked")
    else:
        node.ipam_dir.mkdir(mode=0o755)
        os.symlink(target, node.ipam_dir / "sriov-net")
    refused(node.cni("ADD", conf, netns=pod), Code.IO_FAILURE)
    assert list(target.iterdir()) == []
    assert node.picture()["host"] == before["host"] and node.picture()["fake"] == before["fake"]


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777, 0o722])
def test_state_directory_writable_by_others_is_refused(ready: Ready, mode: int) -> None:
    node, pod, before = ready
    node.data_dir.mkdir()
    node.data_dir.chmod(mode)
    out = refused(node.cni("ADD", node.conf(), netns=pod), Code.IO_FAILURE)
    assert "writable by others" in out["msg"]
    assert node.picture() == before


def test_log_file_is_created_0600_and_a_symlinked_one_is_not_followed(
    ready: Ready, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, pod, before = ready
    log_file = tmp_path / "sriov.log"
    conf = node.conf(logFile=str(log_file), logLevel="debug")
    node.add(conf, netns=pod)
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    assert "allocated VF" in log_file.read_text()

    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    log_file.unlink()
    os.symlink(victim, log_file)
    res = node.cni("DEL", conf, netns=pod)
    assert res.rc == 0, res.stdout
    assert victim.read_text() == "keep\n"
    assert "symlink" in capsys.readouterr().err
    assert node.picture() == before


def test_new_state_directories_are_private(ready: Ready) -> None:
    node, pod, _ = ready
    node.add(node.conf(), netns=pod)
    for d in (node.data_dir, node.data_dir / "vfs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


# --- issue 9: hostile nesting ----------------------------------------------------------------


@pytest.mark.parametrize("opener", ["[", "{", '{"a":'])
@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"])
def test_deeply_nested_config_is_a_decode_error(node: Node, opener: str, command: str) -> None:
    stdin = (opener * 100000).encode()
    out, err = io.StringIO(), io.StringIO()
    rc = commands.run(node.env(command), stdin, out, err, node.deps())
    if command == "VERSION":
        assert rc == 0 and json.loads(out.getvalue())["supportedVersions"]
    else:
        assert rc == 1 and json.loads(out.getvalue())["code"] == Code.DECODE
    assert "Traceback" not in out.getvalue() + err.getvalue()


def test_moderately_nested_config_is_a_decode_error(node: Node) -> None:
    # Deep enough to parse, deep enough to exhaust the stack in anything that
    # walks it afterwards: refused at decoding all the same.
    conf = node.conf()
    conf["x"] = json.loads("[" * 900 + "]" * 900)
    res = node.cni("ADD", conf, netns="/run/netns/none")
    refused(res, Code.DECODE)


def test_deeply_nested_config_through_the_executable(node: Node, tmp_path: Path) -> None:
    env = node.env("ADD", netns="/run/netns/none")
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    res = run_bin(env, b"[" * 100000)
    refused(res, Code.DECODE)


def test_restored_link_matches_the_oracle(ready: Ready) -> None:
    # The restore path that now looks links up by PCI/MAC still gives back
    # exactly what iproute2 saw before.
    node, pod, before = ready
    conf = node.conf(mac="02:aa:00:00:00:07")
    node.add(conf, netns=pod)
    pod_link = link("net1", os.path.basename(pod))
    assert pod_link is not None and pod_link["address"] == "02:aa:00:00:00:07"
    assert node.cni("DEL", conf, netns=pod).rc == 0
    vf = node.pfs[0].vfs[0]
    assert vf.netdev is not None
    assert netdev_view(link(vf.netdev) or {}) == before["host"][vf.netdev]
