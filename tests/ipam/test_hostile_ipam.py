"""Hostile and odd input to sriov-ipam: regression tests for the defects found."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.cni import Code
from tests.ipam.ipamtypes import Invoke


def net(tmp_path: Path, **ipam: Any) -> dict[str, Any]:
    section = {"type": "sriov-ipam", "dataDir": str(tmp_path / "data"), "ranges": [[{"subnet": "10.70.0.0/24"}]]}
    section.update(ipam)
    return {"cniVersion": "1.0.0", "name": "hnet", "ipam": section}


def reserved(tmp_path: Path) -> set[str]:
    d = tmp_path / "data" / "hnet"
    return {p.name for p in d.iterdir() if p.name[0].isdigit()} if d.is_dir() else set()


@pytest.mark.parametrize("cid", ["c1\n", "c1\r\n", "c1 ", "\tc1"])
@pytest.mark.parametrize("command", ["ADD", "CHECK", "DEL"])
def test_container_id_with_whitespace_is_refused(cni: Invoke, tmp_path: Path, cid: str, command: str) -> None:
    res = cni(command, net(tmp_path), cid=cid)
    assert res.rc != 0 and res.code == Code.INVALID_ENV
    assert reserved(tmp_path) == set()


def test_add_check_del_round_trip_leaves_nothing(cni: Invoke, tmp_path: Path) -> None:
    conf = net(tmp_path)
    assert cni("ADD", conf, cid="c1").rc == 0
    assert cni("CHECK", conf, cid="c1").rc == 0
    assert cni("DEL", conf, cid="c1").rc == 0
    assert reserved(tmp_path) == set()


def test_thousands_of_small_ranges_are_accepted(exe: Invoke, tmp_path: Path) -> None:
    base = int(ipaddress.ip_address("10.128.0.0"))
    ranges = [[{"subnet": f"{ipaddress.ip_address(base + 4 * i)}/30"} for i in range(3000)]]
    res = exe("ADD", net(tmp_path, ranges=ranges))
    assert res.addresses() == ["10.128.0.2/30"]


@pytest.mark.parametrize("far", [1, 1500, 2999])
def test_overlap_among_thousands_of_ranges_is_found(cni: Invoke, tmp_path: Path, far: int) -> None:
    base = int(ipaddress.ip_address("10.128.0.0"))
    ranges = [[{"subnet": f"{ipaddress.ip_address(base + 4 * i)}/30"} for i in range(3000)]]
    # A later range set covering one /30 far down the list.
    clash = ipaddress.ip_address(base + 4 * far)
    ranges.append([{"subnet": f"{clash}/30"}])
    res = cni("ADD", net(tmp_path, ranges=ranges))
    assert res.rc != 0 and res.code == Code.INVALID_CONFIG
    assert res.msg.startswith("ipam.ranges[1][0]") and "overlaps" in res.msg and f"ranges[0][{far}]" in res.msg


def test_gateway_inside_another_range_is_still_refused(cni: Invoke, tmp_path: Path) -> None:
    ranges = [
        [{"subnet": "10.71.0.0/24", "rangeStart": "10.71.0.10", "rangeEnd": "10.71.0.20", "gateway": "10.71.0.1"}],
        [{"subnet": "10.71.0.0/24", "rangeStart": "10.71.0.30", "rangeEnd": "10.71.0.40", "gateway": "10.71.0.15"}],
    ]
    res = cni("ADD", net(tmp_path, ranges=ranges))
    assert res.rc != 0 and res.code == Code.INVALID_CONFIG
    assert res.msg.startswith("ipam.ranges[1][0].gateway")


@pytest.mark.parametrize("data_dir", ["relative", "./data", "data/../x"])
def test_relative_data_dir_is_refused(
    cni: Invoke, tmp_path: Path, data_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for command in ("ADD", "DEL", "GC"):
        conf = net(tmp_path, dataDir=data_dir)
        if command == "GC":
            conf["cniVersion"] = "1.1.0"
        res = cni(command, conf)
        assert res.rc != 0 and res.code == Code.INVALID_CONFIG and "ipam.dataDir" in res.msg
    assert sorted(os.listdir(tmp_path)) == []


def test_symlinked_network_directory_is_not_followed(cni: Invoke, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    (tmp_path / "data").mkdir(mode=0o755)
    os.symlink(victim, tmp_path / "data" / "hnet")
    res = cni("ADD", net(tmp_path))
    assert res.rc != 0 and res.code == Code.IO_FAILURE and "symlink" in res.msg
    assert list(victim.iterdir()) == []


def test_symlinked_last_reserved_file_is_not_followed(cni: Invoke, tmp_path: Path) -> None:
    conf = net(tmp_path)
    assert cni("ADD", conf, cid="c1").rc == 0
    victim = tmp_path / "victim"
    victim.write_text("keep")
    last = tmp_path / "data" / "hnet" / "last_reserved_ip.0"
    last.unlink()
    os.symlink(victim, last)
    res = cni("ADD", conf, cid="c2")
    assert res.rc != 0 and res.code == Code.IO_FAILURE
    assert victim.read_text() == "keep"
    # The failed ADD gave its address back.
    assert len(reserved(tmp_path)) == 1


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_network_directory_writable_by_others_is_refused(cni: Invoke, tmp_path: Path, mode: int) -> None:
    d = tmp_path / "data" / "hnet"
    d.mkdir(parents=True)
    d.chmod(mode)
    res = cni("ADD", net(tmp_path))
    assert res.rc != 0 and res.code == Code.IO_FAILURE and "writable by others" in res.msg
    assert reserved(tmp_path) == set()


def test_new_network_directory_has_host_locals_mode(cni: Invoke, tmp_path: Path) -> None:
    assert cni("ADD", net(tmp_path)).rc == 0
    assert stat.S_IMODE((tmp_path / "data" / "hnet").stat().st_mode) == 0o755


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/urandom", "directory", "huge", "nul"])
def test_resolv_conf_that_is_no_small_file_is_refused(exe: Invoke, tmp_path: Path, kind: str) -> None:
    path = {"directory": str(tmp_path), "nul": "/etc/\0resolv.conf"}.get(kind, kind)
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif kind == "huge":
        path = str(tmp_path / "huge")
        Path(path).write_text("# padding\n" * 20000)
    res = exe("ADD", net(tmp_path, resolvConf=path))
    assert res.rc != 0 and res.code == Code.INVALID_CONFIG and res.msg.startswith("ipam.resolvConf")
    assert "Traceback" not in res.stderr
    assert reserved(tmp_path) == set()


def test_resolv_conf_through_a_symlink_is_read(cni: Invoke, tmp_path: Path) -> None:
    real = tmp_path / "real-resolv.conf"
    real.write_text("nameserver 10.0.0.53\nsearch example.org\n")
    os.symlink(real, tmp_path / "resolv.conf")
    res = cni("ADD", net(tmp_path, resolvConf=str(tmp_path / "resolv.conf")))
    assert res.rc == 0 and res.out is not None
    assert res.out["dns"] == {"nameservers": ["10.0.0.53"], "search": ["example.org"]}


@pytest.mark.parametrize("opener", ["[", "{"])
def test_deeply_nested_config_is_a_decode_error(exe_path: Path, tmp_path: Path, opener: str) -> None:
    import subprocess

    env = {
        **os.environ,
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/var/run/netns/x",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/usr/lib/cni",
    }
    proc = subprocess.run([str(exe_path)], input=(opener * 100000).encode(), env=env, capture_output=True, timeout=120)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["code"] == Code.DECODE
    assert b"Traceback" not in proc.stdout + proc.stderr
