"""ADD, DEL, CHECK, GC and STATUS through dispatch, in-process, on a real store."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.cni import CNIError, Code
from sriov_cni.ipam import allocator, config, store
from tests.ipam.ipamtypes import Invoke, MakeConf, Stored

SMALL = [[{"subnet": "10.0.0.0/29"}]]  # .1 gateway, .2-.6 usable, .7 broadcast
DUAL = [[{"subnet": "10.0.0.0/24"}], [{"subnet": "2001:db8::/64", "gateway": "2001:db8::fe"}]]


def add_first(cni: Invoke, conf: dict[str, Any], cid: str, ifname: str = "eth0", cni_args: str = "") -> str:
    return cni("ADD", conf, cid=cid, ifname=ifname, cni_args=cni_args).addresses()[0]


def test_round_robin_continues_after_last_reservation_and_wraps(cni: Invoke, netconf: MakeConf) -> None:
    conf = netconf(SMALL)
    assert [add_first(cni, conf, c) for c in ("a", "b")] == ["10.0.0.2/29", "10.0.0.3/29"]
    assert cni("DEL", conf, cid="a").rc == 0
    # Round robin: .2 is free again but the next address comes after .3.
    assert [add_first(cni, conf, c) for c in ("c", "d", "e")] == ["10.0.0.4/29", "10.0.0.5/29", "10.0.0.6/29"]
    # Past the end it wraps, skips the gateway .1 and finds the freed .2.
    assert add_first(cni, conf, "f") == "10.0.0.2/29"
    full = cni("ADD", conf, cid="g")
    assert (full.rc, full.code) == (1, Code.NOT_AVAILABLE)
    assert "no free addresses left in range set ipam.ranges[0]" in full.msg


def test_gateway_inside_the_range_is_skipped(cni: Invoke, netconf: MakeConf) -> None:
    conf = netconf([[{"subnet": "10.0.0.0/29", "gateway": "10.0.0.3"}]])
    got = [add_first(cni, conf, f"c{i}") for i in range(5)]
    assert got == ["10.0.0.1/29", "10.0.0.2/29", "10.0.0.4/29", "10.0.0.5/29", "10.0.0.6/29"]


def test_walks_every_range_of_a_set_in_order(cni: Invoke, netconf: MakeConf) -> None:
    conf = netconf(
        [
            [
                {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.11"},
                {"subnet": "10.0.1.0/24", "rangeStart": "10.0.1.20", "rangeEnd": "10.0.1.22", "gateway": "10.0.1.21"},
            ]
        ]
    )
    got = [add_first(cni, conf, f"c{i}") for i in range(4)]
    assert got == ["10.0.0.10/24", "10.0.0.11/24", "10.0.1.20/24", "10.0.1.22/24"]
    assert cni("ADD", conf, cid="c9").code == Code.NOT_AVAILABLE


def test_round_robin_position_is_host_locals_last_reserved_file(cni: Invoke, netconf: MakeConf, net_dir: Path) -> None:
    conf = netconf(SMALL)
    net_dir.mkdir(parents=True)
    (net_dir / "last_reserved_ip.0").write_text("10.0.0.4")
    assert add_first(cni, conf, "a") == "10.0.0.5/29"
    assert (net_dir / "last_reserved_ip.0").read_text() == "10.0.0.5"


def test_repeated_add_returns_the_address_already_held(cni: Invoke, netconf: MakeConf, stored: Stored) -> None:
    conf = netconf(DUAL)
    first = cni("ADD", conf, cid="a").addresses()
    assert cni("ADD", conf, cid="a").addresses() == first
    assert cni("ADD", conf, cid="a", ifname="net1").addresses() != first
    assert sorted(stored().values()) == ["a\r\neth0"] * 2 + ["a\r\nnet1"] * 2


def test_hint_is_verified_against_the_address_file(cni: Invoke, netconf: MakeConf, net_dir: Path) -> None:
    conf = netconf(SMALL)
    assert add_first(cni, conf, "a") == "10.0.0.2/29"
    # Another tool released a's address and gave it to b without touching
    # our hint: a repeated ADD for a must not return b's address.
    (net_dir / "10.0.0.2").write_bytes(b"b\r\neth0")
    assert add_first(cni, conf, "a") == "10.0.0.3/29"
    assert (net_dir / "10.0.0.2").read_bytes() == b"b\r\neth0"


def test_requested_address_from_each_source(cni: Invoke, netconf: MakeConf, stored: Stored) -> None:
    conf = netconf([[{"subnet": "10.0.0.0/24"}]])
    assert add_first(cni, conf, "a", cni_args="IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.0.0.50") == "10.0.0.50/24"
    assert add_first(cni, {**conf, "runtimeConfig": {"ips": ["10.0.0.60/24"]}}, "b") == "10.0.0.60/24"
    # args.cni.ips replaces CNI_ARGS IP, as the conventions require.
    both = {**conf, "args": {"cni": {"ips": ["10.0.0.70"]}}}
    assert add_first(cni, both, "c", cni_args="IP=10.0.0.71") == "10.0.0.70/24"
    # Repeating the same request is idempotent.
    assert add_first(cni, conf, "a", cni_args="IP=10.0.0.50") == "10.0.0.50/24"
    assert stored() == {"10.0.0.50": "a\r\neth0", "10.0.0.60": "b\r\neth0", "10.0.0.70": "c\r\neth0"}


def test_requested_address_taken_is_a_clear_error(cni: Invoke, netconf: MakeConf, stored: Stored) -> None:
    conf = netconf([[{"subnet": "10.0.0.0/24"}]])
    add_first(cni, conf, "a", cni_args="IP=10.0.0.50")
    got = cni("ADD", conf, cid="b", cni_args="IP=10.0.0.50")
    assert (got.rc, got.code) == (1, Code.INVALID_CONFIG)
    assert got.msg == "CNI_ARGS IP 10.0.0.50 is already reserved by container a interface eth0"
    conflict = cni("ADD", conf, cid="a", cni_args="IP=10.0.0.51")
    assert conflict.code == Code.INVALID_CONFIG and "a interface eth0 already holds in" in conflict.msg
    assert stored() == {"10.0.0.50": "a\r\neth0"}


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_dual_stack_result_per_spec_version(cni: Invoke, netconf: MakeConf, version: str) -> None:
    routes = [{"dst": "0.0.0.0/0"}, {"dst": "2001:db8:1::/48", "gw": "2001:db8::fe"}]
    got = cni("ADD", netconf(DUAL, version=version, routes=routes))
    assert got.rc == 0
    old = version < "1.0.0"
    assert got.out == {
        "cniVersion": version,
        "ips": [
            {"address": "10.0.0.2/24", "gateway": "10.0.0.1", **({"version": "4"} if old else {})},
            {"address": "2001:db8::1/64", "gateway": "2001:db8::fe", **({"version": "6"} if old else {})},
        ],
        "routes": routes,
    }


def test_failure_in_a_later_set_releases_the_earlier_ones(cni: Invoke, netconf: MakeConf, stored: Stored) -> None:
    conf = netconf([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/30"}]])
    assert cni("ADD", conf, cid="a").addresses() == ["10.0.0.2/24", "10.1.0.2/30"]
    got = cni("ADD", conf, cid="b")
    assert (got.rc, got.code) == (1, Code.NOT_AVAILABLE)
    assert "ipam.ranges[1]" in got.msg
    assert stored() == {"10.0.0.2": "a\r\neth0", "10.1.0.2": "a\r\neth0"}


def test_del_releases_every_set_and_is_idempotent(
    cni: Invoke, netconf: MakeConf, net_dir: Path, stored: Stored, data_dir: Path
) -> None:
    conf = netconf(DUAL)
    cni("ADD", conf, cid="a")
    cni("ADD", conf, cid="b")
    for _ in range(2):
        got = cni("DEL", conf, cid="a")
        assert (got.rc, got.out) == (0, None)
    assert sorted(stored()) == ["10.0.0.3", "2001:db8::2"]
    assert not (net_dir / "attachment:a:eth0").exists()
    assert cni("DEL", conf, cid="never-added").rc == 0


def test_del_without_a_store_succeeds_and_creates_nothing(cni: Invoke, netconf: MakeConf, data_dir: Path) -> None:
    assert cni("DEL", netconf(SMALL)).rc == 0
    assert not data_dir.exists()


def test_del_tolerates_a_broken_range_config(cni: Invoke, netconf: MakeConf, stored: Stored) -> None:
    conf = netconf(SMALL)
    cni("ADD", conf, cid="a")
    conf["ipam"]["ranges"] = [[{"subnet": "10.0.0.0/31"}]]
    assert cni("DEL", conf, cid="a").rc == 0
    assert stored() == {}


def test_del_finds_reservations_it_has_no_hint_for(
    cni: Invoke, netconf: MakeConf, net_dir: Path, stored: Stored
) -> None:
    conf = netconf(SMALL)
    net_dir.mkdir(parents=True)
    (net_dir / "10.0.0.4").write_bytes(b"x\r\neth0")
    (net_dir / "10.0.0.5").write_bytes(b"x\r\nnet1")
    # A legacy file (container ID only) is released only when no file
    # names the interface, as host-local does.
    (net_dir / "10.0.0.6").write_bytes(b"x")
    assert cni("DEL", conf, cid="x").rc == 0
    assert stored() == {"10.0.0.5": "x\r\nnet1", "10.0.0.6": "x"}
    assert cni("DEL", conf, cid="x").rc == 0
    assert stored() == {"10.0.0.5": "x\r\nnet1"}


def test_check_needs_a_matching_reservation_in_every_set(cni: Invoke, netconf: MakeConf, net_dir: Path) -> None:
    conf = netconf(DUAL)
    cni("ADD", conf, cid="a")
    assert (cni("CHECK", conf, cid="a").rc, cni("CHECK", conf, cid="a").out) == (0, None)
    other = cni("CHECK", conf, cid="a", ifname="net1")
    assert (other.rc, other.code) == (1, Code.IPAM)
    (net_dir / "2001:db8::1").unlink()
    half = cni("CHECK", conf, cid="a")
    assert half.code == Code.IPAM
    assert half.msg == "no address reserved in ipam.ranges[1] for container a interface eth0"


def test_check_accepts_legacy_and_foreign_reservations(cni: Invoke, netconf: MakeConf, net_dir: Path) -> None:
    conf = netconf(SMALL)
    net_dir.mkdir(parents=True)
    (net_dir / "10.0.0.3").write_bytes(b"legacy")
    assert cni("CHECK", conf, cid="legacy").rc == 0
    assert cni("CHECK", conf, cid="other").code == Code.IPAM


def gc_conf(conf: dict[str, Any], key: str, valid: list[tuple[str, str]] | None) -> dict[str, Any]:
    out = {**conf, "cniVersion": "1.1.0"}
    if valid is not None:
        out[key] = [{"containerID": c, "ifname": i} for c, i in valid]
    return out


@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_gc_releases_what_is_not_listed(
    cni: Invoke, netconf: MakeConf, net_dir: Path, stored: Stored, key: str
) -> None:
    conf = netconf(DUAL, version="1.1.0")
    for cid in ("a", "b", "c"):
        cni("ADD", conf, cid=cid)
    (net_dir / "10.0.0.99").write_bytes(b"b")  # legacy file of a listed container
    (net_dir / "10.0.0.98").write_bytes(b"gone")
    got = cni("GC", gc_conf(conf, key, [("b", "eth0")]))
    assert (got.rc, got.out) == (0, None)
    assert stored() == {"10.0.0.3": "b\r\neth0", "2001:db8::2": "b\r\neth0", "10.0.0.99": "b"}
    names = {p.name for p in net_dir.iterdir()} - set(stored())
    assert names == {"lock", "last_reserved_ip.0", "last_reserved_ip.1", "attachment:b:eth0"}


def test_gc_without_a_list_releases_everything(cni: Invoke, netconf: MakeConf, net_dir: Path, stored: Stored) -> None:
    conf = netconf(SMALL, version="1.1.0")
    cni("ADD", conf, cid="a")
    assert cni("GC", gc_conf(conf, "", None)).rc == 0
    assert stored() == {}
    assert {p.name for p in net_dir.iterdir()} == {"lock", "last_reserved_ip.0"}


def test_gc_rejects_a_malformed_list(cni: Invoke, netconf: MakeConf) -> None:
    conf = {**netconf(SMALL, version="1.1.0"), "cni.dev/valid-attachments": [{"containerID": "a"}]}
    got = cni("GC", conf)
    assert (got.code, got.msg) == (
        Code.INVALID_CONFIG,
        "cni.dev/valid-attachments[0].ifname must be a non-empty string",
    )


@pytest.mark.parametrize(
    "value",
    [None, False, 0, "", {}, [{"containerID": "a"}], [{"containerID": "a", "ifname": ""}]],
    ids=["null", "false", "0", "empty string", "empty object", "entry without ifname", "entry with empty ifname"],
)
def test_gc_with_a_malformed_list_releases_nothing(
    cni: Invoke, netconf: MakeConf, stored: Stored, value: object
) -> None:
    # The same parser as the sriov plugin's GC: both refuse before releasing.
    conf = netconf(SMALL, version="1.1.0")
    cni("ADD", conf, cid="a")
    held = stored()
    assert held
    got = cni("GC", {**conf, "cni.dev/valid-attachments": value})
    assert got.code == Code.INVALID_CONFIG and got.msg.startswith("cni.dev/valid-attachments")
    assert stored() == held


def test_status_reports_an_exhausted_range_set(cni: Invoke, netconf: MakeConf) -> None:
    conf = netconf([[{"subnet": "2001:db8::/64"}], [{"subnet": "10.0.0.0/30"}]], version="1.1.0")
    assert (cni("STATUS", conf).rc, cni("STATUS", conf).out) == (0, None)
    cni("ADD", conf, cid="a")
    got = cni("STATUS", conf)
    assert (got.rc, got.code) == (1, Code.NOT_AVAILABLE)
    assert got.msg == "range set ipam.ranges[1] is exhausted: all 1 addresses are reserved"
    cni("DEL", conf, cid="a")
    assert cni("STATUS", conf).rc == 0


def test_io_failure_names_the_path(cni: Invoke, netconf: MakeConf, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    conf = netconf(SMALL, dataDir=str(blocker))
    got = cni("ADD", conf)
    assert (got.rc, got.code) == (1, Code.IO_FAILURE)
    assert str(blocker) in got.msg
    assert "Traceback" not in got.stderr


def test_disk_full_leaves_no_half_written_reservation(
    cni: Invoke, netconf: MakeConf, stored: Stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)  # ipam.store writes its files with os.write
    got = cni("ADD", netconf(SMALL))
    assert (got.rc, got.code) == (1, Code.IO_FAILURE)
    assert "No space left on device" in got.msg
    monkeypatch.undo()
    assert stored() == {}


def test_lock_held_by_another_flock_user_means_try_again(netconf: MakeConf, net_dir: Path) -> None:
    conf = netconf(SMALL)
    cfg = config.load(conf)
    net_dir.mkdir(parents=True)
    # Lock the way host-local does: flock on <dir>/lock.
    fd = os.open(net_dir / "lock", os.O_CREAT | os.O_RDONLY, 0o750)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        busy = store.DiskStore(cfg.data_dir, cfg.network, lock_timeout=0.2)
        with pytest.raises(CNIError) as err:
            allocator.allocate(busy, cfg, store.Owner("a", "eth0"), {})
        assert err.value.code == Code.TRY_AGAIN
        assert str(net_dir / "lock") in err.value.details
    finally:
        os.close(fd)
    assert [a.ip.exploded for a in allocator.allocate(busy, cfg, store.Owner("a", "eth0"), {})] == ["10.0.0.2"]
