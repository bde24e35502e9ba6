"""The real bin/sriov-ipam executable, one process per call as a runtime runs it."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
        "msg": "ipam.ranges[0][0].subnet '10.3.0.0/33' is not a CIDR subnet",
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


def test_parallel_adds_hand_out_distinct_addresses_and_parallel_dels_free_them(
    netconf: MakeConf, net_dir: Path, spawn: Spawn, wait: Wait
) -> None:
    # 200 addresses (.10-.209), 230 clients: exactly 200 must win.
    conf = netconf([[{"subnet": "10.4.0.0/24", "rangeStart": "10.4.0.10", "rangeEnd": "10.4.0.209"}]])
    cids = [f"pod-{i}" for i in range(230)]
    with ThreadPoolExecutor(max_workers=230) as pool:
        procs = [spawn("ADD", conf, cid) for cid in cids]
        results = list(pool.map(wait, procs))
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

    with ThreadPoolExecutor(max_workers=230) as pool:
        procs = [spawn("DEL", conf, cid) for cid in cids]
        assert [rc for rc, _ in pool.map(wait, procs)] == [0] * 230
    assert sorted(p.name for p in net_dir.iterdir()) == ["last_reserved_ip.0", "lock"]
