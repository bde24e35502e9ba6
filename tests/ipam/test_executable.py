"""The real bin/sriov-ipam executable, one process per call as a runtime runs it."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sriov_cni.cni import Code
from tests.ipam.ipamtypes import Invoke, MakeConf, Spawn, Stored, Wait


def test_add_check_del_round_trip(exe: Invoke, netconf: MakeConf, stored: Stored) -> None:
    conf = netconf([[{"subnet": "10.3.0.0/24"}], [{"subnet": "fd00::/64"}]], routes=[{"dst": "0.0.0.0/0"}])
    add = exe("ADD", conf)
    assert add.rc == 0, add.stderr
    assert add.out == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.3.0.2/24", "gateway": "10.3.0.1"}, {"address": "fd00::2/64", "gateway": "fd00::1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    assert stored() == {"10.3.0.2": "c1\r\neth0", "fd00::2": "c1\r\neth0"}
    assert (exe("CHECK", conf).rc, exe("CHECK", conf).out) == (0, None)
    assert (exe("DEL", conf).rc, exe("DEL", conf).out) == (0, None)
    assert stored() == {}
    gone = exe("CHECK", conf)
    assert (gone.rc, gone.code) == (1, Code.IPAM)


def test_errors_are_cni_error_objects_without_tracebacks(exe: Invoke, netconf: MakeConf, tmp_path: Path) -> None:
    bad = exe("ADD", netconf([[{"subnet": "10.3.0.0/33"}]]))
    assert bad.rc == 1
    assert bad.out == {
        "cniVersion": "1.0.0",
        "code": Code.INVALID_CONFIG,
        "msg": 'ipam.ranges[0][0].subnet "10.3.0.0/33" is not a CIDR subnet',
    }
    (tmp_path / "file").write_text("")
    io_err = exe("ADD", netconf([[{"subnet": "10.3.0.0/24"}]], dataDir=str(tmp_path / "file" / "sub")))
    assert io_err.code == Code.IO_FAILURE and str(tmp_path / "file") in io_err.msg
    assert "Traceback" not in bad.stderr + io_err.stderr


def test_version_and_about(exe_path: Path) -> None:
    env = {**os.environ, "CNI_COMMAND": "VERSION"}
    out = subprocess.run([str(exe_path)], input=b'{"cniVersion":"1.0.0"}', env=env, capture_output=True, check=True)
    assert json.loads(out.stdout)["supportedVersions"] == [
        "0.1.0",
        "0.2.0",
        "0.3.0",
        "0.3.1",
        "0.4.0",
        "1.0.0",
        "1.1.0",
    ]
    env.pop("CNI_COMMAND")
    about = subprocess.run([str(exe_path)], input=b"", env=env, capture_output=True, check=True)
    assert about.stdout == b"" and b"sriov-ipam" in about.stderr


def run_all(spawn: Spawn, wait: Wait, command: str, conf: dict[str, Any], cids: list[str]) -> list[tuple[int, Any]]:
    """One call per container at once; a call answered "try again" is run again, as a runtime does.

    Under load the last of 230 callers can wait longer than the store's
    lock timeout, and that answer is the right one then; what the test
    checks is what the calls end with.  Ten rounds only a lock that is
    never released exhausts.
    """
    results: list[tuple[int, Any]] = [(-1, None)] * len(cids)
    pending = list(range(len(cids)))
    for _ in range(10):
        with ThreadPoolExecutor(max_workers=len(pending)) as pool:
            procs = [spawn(command, conf, cids[i]) for i in pending]
            for i, result in zip(pending, pool.map(wait, procs), strict=True):
                results[i] = result
        pending = [i for i in pending if results[i][0] != 0 and (results[i][1] or {}).get("code") == Code.TRY_AGAIN]
        if not pending:
            return results
    raise AssertionError(f"{len(pending)} {command}s still answered try again: {results[pending[0]]}")


def test_parallel_adds_hand_out_distinct_addresses_and_parallel_dels_free_them(
    netconf: MakeConf, net_dir: Path, spawn: Spawn, wait: Wait
) -> None:
    # 200 addresses (.10-.209), 230 clients: exactly 200 must win.
    conf = netconf([[{"subnet": "10.4.0.0/24", "rangeStart": "10.4.0.10", "rangeEnd": "10.4.0.209"}]])
    cids = [f"pod-{i}" for i in range(230)]
    results = run_all(spawn, wait, "ADD", conf, cids)
    won = [out["ips"][0]["address"] for rc, out in results if rc == 0 and out]
    lost = [out for rc, out in results if rc != 0]
    assert len(won) == 200 and len(set(won)) == 200
    assert {ip.split("/")[0] for ip in won} == {f"10.4.0.{i}" for i in range(10, 210)}
    assert len(lost) == 30
    assert all(o is not None and o["code"] == Code.NOT_AVAILABLE and "no free addresses" in o["msg"] for o in lost)
    files = {p.name: p.read_bytes().decode() for p in net_dir.iterdir() if p.name.startswith("10.")}
    winners = {
        out["ips"][0]["address"].split("/")[0]: cid
        for cid, (rc, out) in zip(cids, results, strict=True)
        if rc == 0 and out
    }
    assert files == {ip: f"{cid}\r\neth0" for ip, cid in winners.items()}

    assert [rc for rc, _ in run_all(spawn, wait, "DEL", conf, cids)] == [0] * 230
    assert sorted(p.name for p in net_dir.iterdir()) == ["last_reserved_ip.0", "lock"]
