"""The daemon's healing process: records of an earlier boot given back at start, and counted in its metrics.

Real: the daemon (``sriov-cni daemon``) and its healing process, the
host's kernel (PF-side settings are asked of a PF this host does not have,
which fails as on a node whose PF went), sriov-ipam in process.  Fixture:
the records, written as an ADD of an earlier boot left them.
tests/plugin/test_heal.py and tests/vm/test_heal_igb.py give back VFs.
"""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sriov_cni.cni import dispatch
from sriov_cni.ipam.main import HANDLERS
from sriov_cni.kernel.vfsettings import PfSettings, Vlan
from sriov_cni.vfstore import Allocation, FileStore, OriginalState
from tests.support.daemonlib import Daemon, wait_for
from tests.support.pluginlib import ipam_reservations


def _record(vf_pci: str, container: str, **fields: object) -> Allocation:
    return Allocation(
        vf_pci=vf_pci,
        pf_pci="0000:e0:00.0",
        pf_netdev="nosuchpf0",
        vf_index=int(vf_pci[-1]),
        network="net-a",
        container_id=container,
        ifname="net1",
        netns="/var/run/netns/gone-with-the-reboot",
        netns_inode=4026539999,
        boot_id="an earlier boot",
        **fields,  # type: ignore[arg-type]
    )


def _reserve(ipam_conf: dict[str, object], container: str) -> str:
    """An address sriov-ipam gives ``container``, as the earlier boot's ADD got it."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": container, "CNI_NETNS": "/proc/1/ns/net", "CNI_IFNAME": "net1"}
    out = io.StringIO()
    assert dispatch(HANDLERS, env, json.dumps(ipam_conf).encode(), out, io.StringIO(), "sriov-ipam") == 0, (
        out.getvalue()
    )
    return str(json.loads(out.getvalue())["ips"][0]["address"])


def _scrape(url: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return {
        (s.name, s.labels.get("reason", ""), s.labels.get("result", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sriov_cni_vfs_given_back_total"
    }


def test_records_of_an_earlier_boot_are_given_back_at_start_and_counted(tmp_path: Path) -> None:
    state, ipam_dir = tmp_path / "state", tmp_path / "ipam"
    ipam_conf: dict[str, object] = {
        "cniVersion": "1.0.0",
        "name": "net-a",
        "type": "sriov",
        "ipam": {"type": "sriov-ipam", "dataDir": str(ipam_dir), "ranges": [[{"subnet": "10.44.0.0/24"}]]},
    }
    address = _reserve(ipam_conf, "ctr-a")
    assert ipam_reservations(ipam_dir, "net-a") == {address.split("/")[0]}
    store = FileStore(state)
    # An ADD that died before it changed anything; and one whose VF's PF
    # settings cannot be put back (its PF is not there).
    store.put(_record("0000:e0:10.1", "ctr-a", ipam_config=ipam_conf))
    store.put(
        _record(
            "0000:e0:10.2",
            "ctr-b",
            original=OriginalState(pf=PfSettings(vlan=Vlan(0, 0, 0x8100))),
            applied=PfSettings(vlan=Vlan(100, 0, 0x8100)),
        )
    )

    with Daemon(tmp_path / "run", "--data-dir", str(state), "--metrics-address", "127.0.0.1:0", "--no-nri") as daemon:
        url = daemon.banner.split("metrics on ")[1].strip()
        counted = wait_for(lambda: len(_scrape(url)) == 2 and _scrape(url))
        assert counted == {
            ("sriov_cni_vfs_given_back_total", "earlier boot", "given_back"): 1.0,
            ("sriov_cni_vfs_given_back_total", "earlier boot", "failed"): 1.0,
        }
        assert [a.container_id for a in store.all()] == ["ctr-b"]
        assert ipam_reservations(ipam_dir, "net-a") == set()
        [kept] = store.all()
        assert kept.giving_back == "earlier boot"
