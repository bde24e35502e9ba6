"""Seeded property-based test of the CNI edge of both plugins.

Hypothesis generates odd environments and configurations (hostile IDs and
names, wrong types and sizes for every key, odd paths, broken stdin) and
every call must:

* return, within a bound, without an exception escaping ``run``/``dispatch``;
* exit non-zero exactly when stdout is a CNI error object, never code 999;
* write nothing outside its dataDir (cwd and a symlink target stay as they are);
* after a failed ADD leave no VF record, no address and the VF netdevs as they were.

``derandomize`` makes the run reproducible (the examples follow from the test
itself), and the example counts keep it to some tens of seconds.
"""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sriov_cni.cni import Code, dispatch
from sriov_cni.ipam.main import HANDLERS as IPAM_HANDLERS
from sriov_cni.plugin import commands
from tests.support.pluginlib import Node, ipam_reservations

# Generous: a call takes well under a second; this only catches hangs.
ANSWER_BOUND = 60.0

ODD_STRINGS = st.sampled_from(
    ["", "c1\n", "net%d", "a" * 300, "\0", "..", "/", "x:y", "é", "\udcff", " ", "-", "%s%n", "net1", "ctr-2"]
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    ODD_STRINGS,
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
CONF_KEYS = [
    "cniVersion",
    "name",
    "deviceID",
    "pciBusID",
    "pfNames",
    "master",
    "mac",
    "vlan",
    "vlanQoS",
    "vlanProto",
    "spoofchk",
    "trust",
    "link_state",
    "min_tx_rate",
    "max_tx_rate",
    "logLevel",
    "logFile",
    "dataDir",
    "dns",
    "prevResult",
    "runtimeConfig",
    "args",
    "ipam",
    "cni.dev/valid-attachments",
]
IPAM_KEYS = ["type", "dataDir", "subnet", "rangeStart", "rangeEnd", "gateway", "ranges", "routes", "resolvConf"]
COMMANDS = st.sampled_from(["ADD"] * 6 + ["DEL", "CHECK", "GC", "STATUS", "VERSION", "BOGUS"])


def _hostile_value(key: str, paths: dict[str, str]) -> st.SearchStrategy[Any]:
    specific: dict[str, list[Any]] = {
        "dataDir": [paths["data"], "relative", paths["link"], paths["file"] + "/sub", "/x\0y", paths["open"]],
        "logFile": [paths["log"], "rel.log", paths["link"] + "/log", "/dev/full", paths["fifo"], "/x\0"],
        "resolvConf": ["/dev/zero", paths["fifo"], "/etc/hostname", "/x\0", paths["link"]],
        "pfNames": [[paths["pf"] + "#0-30000000"], [paths["pf"] + "#0-1"], ["\0"], [paths["pf"]], "x"],
        "cniVersion": ["1.1.0", "1.0.0", "0.4.0", "0.3.1", "9.9.9"],
    }
    options = [JSON_VALUES]
    if key in specific:
        options.append(st.sampled_from(specific[key]))
    return st.one_of(*options)


def _mostly(draw: st.DrawFn, usual: st.SearchStrategy[str], odd: st.SearchStrategy[str]) -> str:
    # Odd environment values one time in eight: they are refused before the
    # configuration is read, and the configuration's edge needs the examples.
    return draw(odd if draw(st.integers(0, 7)) == 0 else usual)


@st.composite
def invocations(draw: st.DrawFn, node: Node, pod: str, paths: dict[str, str]) -> tuple[dict[str, str], bytes]:
    command = draw(COMMANDS)
    env = node.env(
        command,
        container=_mostly(draw, st.sampled_from(["ctr1", "ctr2"]), ODD_STRINGS),
        netns=_mostly(
            draw, st.just(pod), st.sampled_from(["", "/proc/self/ns/net", paths["fifo"], "/run/netns/none", "rel"])
        ),
        ifname=_mostly(draw, st.sampled_from(["net1", "net2"]), ODD_STRINGS),
        args=_mostly(
            draw, st.sampled_from(["", "IP=10.60.0.9"]), st.sampled_from(["MAC=02:00:00:00:00:09", "junk", "K=V;;=x"])
        ),
    )
    if draw(st.integers(0, 9)) == 0:
        return env, draw(st.sampled_from([b"", b"[" * 100000, b"\xff\xfe", b"{", b"null", b'"x"', b"{}"]))
    conf = node.conf(version="1.1.0", ipam=node.sriov_ipam("10.60.0.0/28"))
    conf["logFile"] = paths["log"]
    for key in draw(st.lists(st.sampled_from(CONF_KEYS), max_size=2, unique=True)):
        conf[key] = draw(_hostile_value(key, paths))
    if isinstance(conf.get("ipam"), dict):
        for key in draw(st.lists(st.sampled_from(IPAM_KEYS), max_size=2, unique=True)):
            conf["ipam"][key] = draw(_hostile_value(key, paths))
    return env, json.dumps(conf).encode()


def _bounded(examples: int) -> settings:
    """Seeded (derandomized, no example database) and sized to fit the host suite."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def _answer(call: Any) -> tuple[int, str]:
    box: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        out = io.StringIO()
        try:
            box.append((call(out), out.getvalue()))
        except BaseException as exc:  # reported below: nothing may escape
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(ANSWER_BOUND)
    assert not errors, f"exception escaped: {errors[0]!r}"
    assert box, "the call did not answer"
    return box[0]


def _check_protocol(rc: int, stdout: str) -> dict[str, Any] | None:
    answer = json.loads(stdout) if stdout.strip() else None
    is_error = isinstance(answer, dict) and "code" in answer and "msg" in answer
    assert (rc != 0) == is_error, stdout
    if is_error:
        assert answer is not None
        assert isinstance(answer["code"], int) and answer["code"] != Code.INTERNAL, answer
        assert isinstance(answer["msg"], str) and answer["msg"]
    return answer


@pytest.fixture
def paths(node: Node, tmp_path: Path) -> dict[str, str]:
    node.add_pf(2)
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "plain").write_text("")
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    os.mkfifo(tmp_path / "fifo")
    return {
        "data": str(node.data_dir),
        "log": str(tmp_path / "sriov.log"),
        "link": str(tmp_path / "link"),
        "file": str(tmp_path / "plain"),
        "open": str(tmp_path / "open"),
        "fifo": str(tmp_path / "fifo"),
        "pf": node.pfs[0].name,
        "victim": str(victim),
    }


def test_sriov_plugin_edge(node: Node, paths: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = node.pod()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    host_before = node.picture()["host"]

    @_bounded(250)
    @given(invocation=invocations(node, pod, paths))
    def edge(invocation: tuple[dict[str, str], bytes]) -> None:
        env, stdin = invocation
        records = node.records()
        reserved = ipam_reservations(node.ipam_dir, "sriov-net")
        rc, stdout = _answer(lambda out: commands.run(env, stdin, out, io.StringIO(), node.deps()))
        _check_protocol(rc, stdout)
        assert os.listdir(cwd) == [] and os.listdir(paths["victim"]) == []
        if env["CNI_COMMAND"] == "ADD":
            if rc != 0:
                assert node.records() == records
                assert ipam_reservations(node.ipam_dir, "sriov-net") == reserved
                assert node.picture()["host"] == host_before
            else:
                # Keep the node small: give the VF straight back.
                del_env = dict(env, CNI_COMMAND="DEL")
                rc_del, out_del = _answer(lambda out: commands.run(del_env, stdin, out, io.StringIO(), node.deps()))
                assert rc_del == 0, out_del
                assert node.picture()["host"] == host_before

    edge()


@st.composite
def ipam_invocations(draw: st.DrawFn, data_dir: str, paths: dict[str, str]) -> tuple[dict[str, str], bytes]:
    command = draw(COMMANDS)
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": _mostly(draw, st.sampled_from(["c1", "c2"]), ODD_STRINGS),
        "CNI_NETNS": "/var/run/netns/any",
        "CNI_IFNAME": _mostly(draw, st.just("eth0"), ODD_STRINGS),
        "CNI_ARGS": draw(st.sampled_from(["", "IP=10.61.0.5", "IP=junk", "IP=10.61.0.5,10.61.0.6"])),
        "CNI_PATH": "/usr/lib/cni",
    }
    conf: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "ipamnet",
        "ipam": {"type": "sriov-ipam", "dataDir": data_dir, "ranges": [[{"subnet": "10.61.0.0/28"}]]},
    }
    for key in draw(st.lists(st.sampled_from(IPAM_KEYS), max_size=3, unique=True)):
        conf["ipam"][key] = draw(_hostile_value(key, paths))
    for key in draw(st.lists(st.sampled_from(["args", "runtimeConfig", "cni.dev/valid-attachments"]), max_size=1)):
        conf[key] = draw(JSON_VALUES)
    return env, json.dumps(conf).encode()


def test_sriov_ipam_edge(paths: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "ipam-data"
    cwd = tmp_path / "ipam-cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)

    def held(container: str) -> set[str]:
        network = data_dir / "ipamnet"
        if not network.is_dir():
            return set()
        return {
            p.name
            for p in network.iterdir()
            if p.name[0].isdigit() and p.read_bytes().split(b"\r\n")[0] == container.encode()
        }

    @_bounded(300)
    @given(invocation=ipam_invocations(str(data_dir), paths))
    def edge(invocation: tuple[dict[str, str], bytes]) -> None:
        env, stdin = invocation
        container = env["CNI_CONTAINERID"]
        before = held(container) if container.isprintable() and "\0" not in container else set()
        rc, stdout = _answer(lambda out: dispatch(IPAM_HANDLERS, env, stdin, out, io.StringIO(), "sriov-ipam"))
        _check_protocol(rc, stdout)
        assert os.listdir(cwd) == [] and os.listdir(paths["victim"]) == []
        if env["CNI_COMMAND"] == "ADD" and rc != 0 and container.isprintable():
            assert held(container) == before

    edge()
