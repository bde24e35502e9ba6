"""NetworkAttachmentDefinitions written for the reference Go plugin behave the same here.

Every case in ``compat/manifest.json`` (a config people use, with where it
comes from) is delivered the way its runtime delivers it and run through
``dispatch`` as ADD, then DEL.  ``REFERENCE`` writes down, per case, what
k8snetworkplumbingwg/sriov-cni does with it, derived from its code (HEAD
1b7acc5b): ``pkg/config/config.go`` LoadConf, ``pkg/cnicommands/cni.go``
CmdAdd/CmdDel, ``pkg/sriov/sriov.go`` ApplyVFConfig, ``pkg/types/types.go``
(encoding/json decoding, so keys match case-insensitively) and libcni's skel
(cniVersion, network name).  ``OURS`` lists the few cases where this plugin
deliberately does something else, each with the reason; the README's
"Migrating from sriov-cni" section lists the same.

What is checked comes from outside the plugin: the PF-side VF settings from
the fake PF (what a driver would have been asked to do, and its state after),
the pod's interface and addresses with ``ip``, and which IPAM plugin ran from
that plugin's own log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sriov_cni.vfstore import FileStore
from tests.support.pluginlib import Node, addresses, ipam_reservations, link, link_names

HERE = Path(__file__).parent / "compat"
MANIFEST = json.loads((HERE / "manifest.json").read_text())
CASES = {case["id"]: case for case in MANIFEST["cases"]}

Q, AD = 0x8100, 0x88A8
NO_VLAN = (0, 0, Q)  # "vlan": 0 (with or without vlanQoS 0): written, clearing the VF's VLAN
AUTO, ENABLE, DISABLE = 0, 1, 2

# How containerd and CRI-O fill CNI_ARGS for a pod.
RUNTIME_CNI_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=compat-pod;K8S_POD_INFRA_CONTAINER_ID={cid}"

# What the fake IPAM plugins hand out (see FAKE_IPAM).
IPAM_ADDRESS = "192.0.2.10/24"


@dataclass(frozen=True)
class Ref:
    """What a config does: the VF configured and how, or a refusal.

    ``pf`` holds every PF-side setting written, as the VF's driver is asked
    for it (``vlan`` = (id, qos, proto), ``rate`` = (min, max) Mbps, ``mac``,
    ``spoofchk``, ``trust``, ``link_state``); settings not listed are left
    alone.  ``vf`` None means the call is refused, with ``code`` here.
    """

    vf: str | None
    pf: Mapping[str, Any] = field(default_factory=dict)
    ipam: str | None = None
    # cniVersion of the answer and so its format (0.1.0/0.2.0: ip4/ip6).
    version: str | None = None
    log_level: str = "info"
    code: int = 7
    why: str = ""


def refused(why: str, code: int = 7) -> Ref:
    return Ref(vf=None, code=code, why=why)


VF0, VF1, VF_DPDK = "0000:af:06.0", "0000:af:06.1", "0000:af:06.2"
ENS3_VF0_DPDK, ENS3_VF1 = "0000:03:02.0", "0000:03:02.1"

REFERENCE: dict[str, Ref] = {
    # README and configuration reference
    "readme-nad-kernel": Ref(VF0, ipam="host-local"),
    "readme-extended": Ref(VF1, {"vlan": (1000, 0, Q), "spoofchk": False, "trust": True}, ipam="host-local"),
    "readme-dpdk": Ref(VF_DPDK, {"vlan": (1000, 0, Q)}, why="DPDK VF: PF-side settings only, nothing moved"),
    "confref-all-fields": Ref(
        ENS3_VF0_DPDK,
        {
            "vlan": (1000, 4, AD),
            "mac": "ca:fe:c0:ff:ee:00",
            "rate": (100, 200),
            "spoofchk": False,
            "trust": True,
            "link_state": ENABLE,
        },
        log_level="debug",
        why="ApplyVFConfig order: vlan, mac (lower-cased in CmdAdd), rate, spoofchk, trust, link_state",
    ),
    "confref-runtime-mac": Ref(
        VF1, {"mac": "ca:fe:c0:ff:ee:00"}, ipam="host-local", why="runtimeConfig.mac from the mac capability"
    ),
    "loadconf-no-deviceid": refused("LoadConf: 'VF pci addr is required'"),
    # pkg/config/config_test.go fixtures
    "cfgtest-existing-deviceid": Ref(VF1, ipam="host-local", why='"vf" is no key of NetConf: ignored'),
    "cfgtest-missing-deviceid": refused("getVfInfo: no such PCI device"),
    "cfgtest-broken-json": refused("skel: the config is not JSON", code=6),
    "cfgtest-vlan-valid": Ref(VF1, {"vlan": (100, 0, Q)}),
    "cfgtest-vlan-5000": refused("vlan out of 0-4094"),
    "cfgtest-vlan0-qos1": refused("non-zero vlanQoS needs a non-zero vlan"),
    "cfgtest-vlan0-8021ad": refused("802.1ad needs a non-zero vlan"),
    "cfgtest-qos10": refused("vlanQoS out of 0-7"),
    "cfgtest-proto-802": refused("vlanProto neither 802.1q nor 802.1ad"),
    "cfgtest-proto-8021Q": Ref(VF1, {"vlan": (100, 0, Q)}, why="vlanProto is lower-cased before the check"),
    "cfgtest-proto-8021ad": Ref(VF1, {"vlan": (100, 0, AD)}),
    "cfgtest-novlan-qos1": refused("vlanQoS without vlan"),
    "cfgtest-novlan-8021ad": refused("vlanProto without vlan"),
    "cfgtest-vlan-defaults": Ref(VF1, {"vlan": NO_VLAN}),
    # test/integration (bash_unit) configs
    "integ-macaddress": Ref(VF0, {"mac": "60:00:00:00:00:e1"}, ipam="test-ipam-cni", log_level="debug"),
    "integ-vlan": Ref(
        VF0,
        {"vlan": (1234, 0, Q), "mac": "60:00:00:00:00:e1"},
        ipam="test-ipam-cni",
        log_level="debug",
        why="the test asserts 'LinkSetVfVlanQosProto enp175s0f1 0 1234 0 33024'",
    ),
    "integ-mtu-reset": Ref(
        VF0, {"vlan": (1234, 0, Q), "mac": "60:00:00:00:00:e1"}, ipam="test-ipam-cni", log_level="debug"
    ),
    "integ-concurrent": Ref(VF0, ipam="test-ipam-cni", log_level="debug"),
    "integ-long-running-ipam": Ref(VF0, {"vlan": NO_VLAN}, ipam="test-ipam-cni", log_level="debug"),
    # sriov-network-operator renderings
    "op-golden-simple": Ref(VF0, {"vlan": NO_VLAN}, why='"ipam": {} has no type: no IPAM'),
    "op-golden-chained": Ref(VF0, {"vlan": NO_VLAN}, why="libcni gives the list entry the list's name and version"),
    "op-vlan-qos-proto": Ref(VF1, {"vlan": (100, 5, AD)}, ipam="host-local"),
    "op-spoofchk-on": Ref(VF1, {"vlan": NO_VLAN, "spoofchk": True}, ipam="host-local"),
    "op-trust-on": Ref(VF1, {"vlan": NO_VLAN, "trust": True}, ipam="host-local"),
    "op-loglevel-logfile": Ref(VF1, {"vlan": NO_VLAN}, ipam="host-local", log_level="debug"),
    "op-dhcp-vlan200": Ref(VF1, {"vlan": (200, 0, Q)}, ipam="dhcp"),
    "op-linkstate-enable": Ref(VF1, {"vlan": NO_VLAN, "link_state": ENABLE}, ipam="host-local"),
    "op-linkstate-disable": Ref(VF1, {"vlan": NO_VLAN, "link_state": DISABLE}, ipam="host-local"),
    "op-linkstate-auto": Ref(VF1, {"vlan": NO_VLAN, "link_state": AUTO}, ipam="host-local"),
    "op-rates": Ref(VF1, {"vlan": NO_VLAN, "rate": (40, 100)}, ipam="host-local"),
    "op-max-rate-only": Ref(
        VF1,
        {"vlan": NO_VLAN, "rate": (0, 100)},
        ipam="host-local",
        why="ApplyVFConfig: the rate not configured is sent as 0",
    ),
    "op-vlan1-qos2": Ref(VF1, {"vlan": (1, 2, Q)}, ipam="host-local"),
    "op-ipv6-hostlocal": Ref(VF1, {"vlan": NO_VLAN}, ipam="host-local"),
    "op-vlanproto-upper": Ref(VF1, {"vlan": (100, 0, AD)}, why='"802.1AD" lower-cased by LoadConf'),
    "op-qos-without-vlan": refused("non-zero vlanQoS needs a non-zero vlan"),
    "op-caps-static-mac-ips": Ref(VF1, {"vlan": NO_VLAN, "mac": "86:1d:96:ff:55:0d"}, ipam="static"),
    "op-advanced-metaplugins": Ref(VF1, {"vlan": NO_VLAN, "mac": "02:11:22:33:44:55"}),
    "op-whereabouts": Ref(VF1, {"vlan": (100, 0, Q)}, ipam="whereabouts"),
    "op-static-addresses": Ref(VF1, {"vlan": NO_VLAN}, ipam="static"),
    "op-template-v031": Ref(VF0, {"vlan": (100, 0, Q), "spoofchk": True, "trust": False}, ipam="host-local"),
    # Multus and StarlingX documentation
    "multus-howto-sriov": Ref(ENS3_VF1, {"vlan": NO_VLAN, "spoofchk": True, "trust": True}, ipam="host-local"),
    "multus-example-sriov-pod": Ref(
        VF0,
        {"vlan": (1000, 0, Q)},
        ipam="host-local",
        version="0.1.0",
        why='libcni passes cniVersion "", which skel reads as 0.1.0',
    ),
    "stx-net1-minimal": Ref(VF_DPDK),
    "stx-net2-vlan2000": Ref(VF0, {"vlan": (2000, 0, Q)}),
    "stx-net3-calico-ipam": Ref(VF1, ipam="calico-ipam"),
    "stx-net4-static-tuning-list": Ref(VF1, ipam="static"),
    # cniVersion: everything in libcni's version.All
    "cniversion-030": Ref(VF0, ipam="host-local"),
    "cniversion-040": Ref(VF0, ipam="host-local"),
    "cniversion-100": Ref(VF0, ipam="host-local"),
    "cniversion-110": Ref(VF0, ipam="host-local"),
    "cniversion-020": Ref(VF0, ipam="host-local", version="0.2.0", why="answered in the ip4/ip6 result format"),
    "cniversion-missing-direct": Ref(VF1, ipam="host-local", version="0.1.0", why="skel: no cniVersion is 0.1.0"),
    # MAC precedence (CmdAdd): config, then CNI_ARGS MAC, then runtimeConfig.mac
    "mac-config-only": Ref(VF0, {"mac": "02:00:00:00:00:01"}),
    "mac-cniargs-over-config": Ref(VF0, {"mac": "02:00:00:00:00:02"}),
    "mac-runtimeconfig-over-all": Ref(VF0, {"mac": "02:00:00:00:00:03"}),
    # encoding/json: keys match case-insensitively
    "key-MAC-upper": Ref(VF0, {"mac": "02:00:00:00:00:0a"}),
    "key-Vlan-capital": Ref(VF0, {"vlan": (100, 0, Q)}),
    "key-spoofChk-camel": Ref(VF0, {"spoofchk": False}),
    "key-vlanqos-lower": Ref(VF0, {"vlan": (10, 3, Q)}),
    "key-deviceId-camel": Ref(VF0),
    "key-runtimeConfig-MAC": Ref(VF0, {"mac": "02:00:00:00:00:0b"}),
    # spoofchk/trust: on only for exactly "on"
    "spoofchk-ON-upper": Ref(VF0, {"spoofchk": False}, why='"ON" != "on": spoof checking off'),
    "trust-true": Ref(VF0, {"trust": False}, why='"true" != "on": trust off'),
    # LoadConf corners
    "linkstate-Enable-capital": refused("link_state is compared case-sensitively"),
    "linkstate-up": refused("invalid link_state"),
    "vlanproto-empty": refused('vlanProto "" is set and neither 802.1q nor 802.1ad'),
    "vlanproto-empty-novlan": refused('vlanProto "" is set, without vlan'),
    "vlanqos0-novlan": refused("vlanQoS 0 is set, without vlan"),
    "vlanproto-novlan": refused("vlanProto without vlan"),
    "vlan-negative": refused("vlan out of 0-4094"),
    "vlan-string": refused("vlan is *int: a string does not decode"),
    "vlan-float": refused("vlan is *int: 100.0 does not decode"),
    "vlan-null": Ref(VF0, why="null leaves the pointers nil: as if absent"),
    "spoofchk-bool": refused("spoofchk is a string: a bool does not decode"),
    "mtu-key": Ref(VF0, why="MTU is overwritten from the VF: no effect"),
    "loglevel-verbose": Ref(VF0, why="unknown levels fall back to info"),
    "loglevel-DEBUG": Ref(VF0, log_level="debug", why="levels are lower-cased"),
    "ipam-empty-type": Ref(VF0, why='CmdAdd runs IPAM only if IPAM.Type != ""'),
    "ipam-no-type": Ref(VF0, why="no type: no IPAM"),
    "mac-multicast": refused("the VF driver refuses a multicast admin MAC (after the VLAN was already set)"),
    "mac-dashes": refused("SetVFHardwareMAC's read-back compare fails on the dashed spelling"),
    "rate-min-above-max": refused("the VF driver refuses min_tx_rate above max_tx_rate"),
    "rate-min-only-prelimited": Ref(VF0, {"rate": (40, 0)}, why="max not configured: sent as 0, clearing 1000"),
    "deviceid-upper": refused("the address is used verbatim in sysfs paths"),
    "deviceid-is-pf": refused("a PF has no physfn"),
    "deviceid-unbound-vf": refused("neither a netdev nor a DPDK driver"),
    "name-invalid": refused("skel: invalid characters in the network name"),
    "cniargs-unknown-no-ignore": refused("LoadArgs: unknown CNI_ARGS without IgnoreUnknown"),
    "master-no-deviceid": refused("LoadConf: 'VF pci addr is required' (self-allocation was removed in 2019)"),
    "runtimeconfig-deviceid-only": refused("the reference reads no runtimeConfig.deviceID"),
}

# Deliberate differences (the README lists them).
OURS: dict[str, Ref] = {
    "linkstate-Enable-capital": Ref(VF0, {"link_state": ENABLE}, why="link_state is case-insensitive here"),
    "deviceid-upper": Ref(VF0, why="PCI addresses are case-insensitive here"),
    "master-no-deviceid": Ref(VF0, ipam="host-local", why="master is a self-allocation pool here"),
    "runtimeconfig-deviceid-only": Ref(VF0, why="runtimeConfig.deviceID (the deviceID capability) names the VF"),
    "cniargs-unknown-no-ignore": Ref(
        VF0, {"mac": "02:00:00:00:00:0c"}, why="CNI_ARGS keys this plugin does not read are ignored"
    ),
    # Same outcome, without the reference's partly configured VF: refused
    # by the config check before anything changes.
    "mac-multicast": refused("a multicast MAC is refused before anything changes"),
    "rate-min-above-max": refused("min_tx_rate above max_tx_rate is refused before anything changes"),
    "deviceid-unbound-vf": refused("a VF with neither netdev nor DPDK driver is not free", code=101),
}

# The fake PF side: every VF of the manifest's node, by PCI address.
NODE_VFS = {vf["pci"]: (pf["netdev"], i) for pf in MANIFEST["node"]["pfs"] for i, vf in enumerate(pf["vfs"])}

FAKE_IPAM = """#!{python}
# A CNI IPAM plugin that records each call and hands out one address, in the
# result format of the config's cniVersion (0.1.0/0.2.0: ip4).
import json, os, sys
conf = json.load(sys.stdin)
command = os.environ["CNI_COMMAND"]
with open(os.environ["COMPAT_IPAM_LOG"], "a") as log:
    log.write(f"{{command}} {name}\\n")
if command == "ADD":
    version = conf.get("cniVersion") or "0.1.0"
    ip = {{"address": "{address}", "gateway": "192.0.2.1"}}
    if version in ("0.1.0", "0.2.0"):
        out = {{"cniVersion": version, "ip4": {{"ip": ip["address"], "gateway": ip["gateway"]}}}}
    else:
        if version < "1.0.0":
            ip["version"] = "4"
        out = {{"cniVersion": version, "ips": [ip]}}
    print(json.dumps(out))
"""


# The notes about keys no reader asked for, per accepted case (every other
# accepted case gets none): the reference's own test configs carry "vf",
# which its decoder drops too (VFID has no JSON tag and "vf" is not
# "vfid"); the Calico IPAM settings belong in the ipam section (Multus
# re-encodes the config, sorting its keys).
UNKNOWN_KEY_NOTES: dict[str, list[str]] = {
    **{
        case_id: ['WARNING config: ignoring unknown keys: "vf"']
        for case_id in (
            "cfgtest-existing-deviceid",
            "cfgtest-vlan-valid",
            "cfgtest-proto-8021Q",
            "cfgtest-proto-8021ad",
            "cfgtest-vlan-defaults",
            "cniversion-missing-direct",
        )
    },
    "stx-net3-calico-ipam": ['WARNING config: ignoring unknown keys: "datastore_type", "kubernetes"'],
    "mtu-key": [
        'INFO config: ignoring "mtu": the reference plugin reads it from a network config but never applies it, '
        "and neither does this one"
    ],
}


_KEY_NOTE = re.compile(
    r" (?P<level>[A-Z]+) sriov \[[^]]*\] (?P<msg>config: ignoring (unknown keys: |.*never applies it).*)"
)


def _key_notes(log: str) -> list[str]:
    """The log's notes about unknown or unused keys, as "LEVEL config: ..."."""
    return [f"{m['level']} {m['msg']}" for m in map(_KEY_NOTE.search, log.splitlines()) if m]


def test_every_case_has_its_reference_behaviour_written_down() -> None:
    assert set(REFERENCE) == set(CASES)
    assert set(OURS) <= set(CASES)
    for case_id, ref in REFERENCE.items():
        # The manifest's own summary of the reference agrees with the table.
        case = CASES[case_id]
        assert (ref.vf is not None) == (case["expect"] == "accept"), case_id
        for key, value in case.get("expect_values", {}).items():
            assert ref.vf is not None
            if key == "pf_settings":
                assert dict(ref.pf) == value, case_id
            elif key.startswith("pf_settings."):
                setting = key.split(".", 1)[1]
                assert ref.pf[setting] == (tuple(value) if isinstance(value, list) else value), case_id
            elif key == "device.pf_netdev":
                assert NODE_VFS[ref.vf][0] == value, case_id
            elif key == "device.vf_index":
                assert NODE_VFS[ref.vf][1] == value, case_id
            elif key == "ipam_type":
                assert ref.ipam == value, case_id
            else:
                assert key == "log_level" and ref.log_level == value, case_id


def _go_json(value: Any) -> Any:
    """A value as Go re-encodes it after decoding into interface{}: numbers are float64."""
    if isinstance(value, dict):
        return {k: _go_json(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_go_json(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def deliver(case: dict[str, Any], node: Node, pod: str, tmp: Path, cid: str) -> tuple[dict[str, str], bytes]:
    """The environment and stdin the plugin gets for a case.

    ``direct``: the file piped as it is (plus ``add_keys``).  ``multus``:
    Multus names a nameless config after its NAD and adds the device
    plugin's VF as deviceID and pciBusID; libcni gives a list entry the
    list's name and cniVersion (a config without one gets ""), puts the
    capability arguments the config declares under runtimeConfig, and
    re-encodes the JSON.  The state directory (this plugin's own key) is set
    to a temporary one, and logFile is redirected into it.
    """
    raw = (HERE / case["file"]).read_bytes()
    cni_args = case.get("cni_args", "")
    try:
        conf = json.loads(raw)
    except ValueError:
        return node.env("ADD", netns=pod, container=cid, args=cni_args), raw
    conf.update(case.get("add_keys", {}))
    entry = conf
    if case["runtime"] == "multus":
        multus = case["multus"]
        conf.setdefault("name", multus["nad_name"])
        if "plugins" in conf:
            entry = next(p for p in conf["plugins"] if p.get("type") == "sriov")
        entry["name"] = conf["name"]
        entry["cniVersion"] = conf.get("cniVersion", "")
        if multus.get("device_id"):
            entry["deviceID"] = entry["pciBusID"] = multus["device_id"]
        caps = entry.get("capabilities") or {}
        runtime = {k: v for k, v in (multus.get("capability_args") or {}).items() if caps.get(k)}
        if runtime:
            entry["runtimeConfig"] = runtime
        cni_args = multus.get("runtime_cni_args", "runtime")
        entry = _go_json(entry)
    entry["dataDir"] = str(node.data_dir)
    if "logFile" in entry:
        entry["logFile"] = str(tmp / "plugin.log")
    args = RUNTIME_CNI_ARGS.format(cid=cid) if cni_args == "runtime" else cni_args
    env = node.env("ADD", netns=pod, container=cid, args=args, path=str(tmp / "bin"))
    env["COMPAT_IPAM_LOG"] = str(tmp / "ipam.log")
    return env, json.dumps(entry).encode()


def build_node(node: Node, case: dict[str, Any], tmp: Path) -> None:
    for pf in MANIFEST["node"]["pfs"]:
        node.add_pf_at(pf["pci"], pf["netdev"], [(vf["pci"], vf["driver"]) for vf in pf["vfs"]], driver=pf["driver"])
    original = {**MANIFEST["original_vf"], **case.get("original_vf", {})}
    for vfs in node.fake.state.values():
        for state in vfs.values():
            state.update(
                mac=original["admin_mac"],
                **{k: v for k, v in original.items() if k not in ("comment", "admin_mac")},
            )
    (tmp / "bin").mkdir()
    types = {"host-local", "test-ipam-cni", "dhcp", "static", "whereabouts", "calico-ipam"}
    for name in types:
        exe = tmp / "bin" / name
        exe.write_text(FAKE_IPAM.format(python=sys.executable, name=name, address=IPAM_ADDRESS))
        exe.chmod(0o755)


FAKE_FIELDS = {"vlan": ("vlan", "qos", "vlan_proto"), "rate": ("min_tx_rate", "max_tx_rate")}


def _state_after(before: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    after = dict(before)
    for key, value in settings.items():
        fields = FAKE_FIELDS.get(key)
        after.update(zip(fields, value, strict=True) if fields else {key: value})
    return after


def ipam_calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("case_id", list(CASES))
def test_case(node: Node, tmp_path: Path, case_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[case_id]
    want = OURS.get(case_id, REFERENCE[case_id])
    tmp = tmp_path / "case"
    tmp.mkdir()
    build_node(node, case, tmp)
    pod = node.pod()
    cid = f"compat-{node.token}"
    env, stdin = deliver(case, node, pod, tmp, cid)
    before = node.picture()

    res = node.run(env, stdin)

    ipam_log = tmp / "ipam.log"
    if want.vf is None:
        assert res.rc != 0, res.stdout
        assert res.code == want.code, res.out
        assert node.picture() == before, "a refused ADD must leave the node as it was"
        assert ipam_calls(ipam_log) == []
        # The runtime's DEL after a failed ADD succeeds (unless the config
        # cannot even be read as one, where the reference's DEL fails too).
        if want.code != 6 and case_id != "name-invalid":
            gone = node.run(dict(env, CNI_COMMAND="DEL"), stdin)
            assert gone.rc == 0 and gone.stdout == "", gone.stdout
            assert node.picture() == before
        return
    assert res.rc == 0, res.stdout + res.stderr

    # The VF chosen and its PF-side settings, from the fake PF.
    pf_name, index = NODE_VFS[want.vf]
    calls = {c[0]: c[3] for c in node.fake.calls}
    assert len(calls) == len(node.fake.calls), node.fake.calls  # each setting written once
    assert {c[1:3] for c in node.fake.calls} <= {(pf_name, index)}
    assert calls == dict(want.pf)
    assert node.fake.state[pf_name][index] == _state_after(before["fake"][pf_name][index], want.pf)
    [record] = FileStore(node.data_dir).all()
    assert record.vf_pci == want.vf

    # The pod side: a kernel VF is there as net1 (with the MAC asked for),
    # with the IPAM's address; a DPDK VF stays where it is.
    ns = os.path.basename(pod)
    vf = next(v for p in node.pfs for v in p.vfs if v.pci == want.vf)
    if vf.netdev is None:
        assert link_names(ns) == {"lo"}
    else:
        inside = link("net1", ns)
        assert inside is not None and vf.netdev not in link_names()
        assert inside["address"] == want.pf.get("mac", before["host"][vf.netdev]["address"])
        assert addresses("net1", ns) == ({IPAM_ADDRESS} if want.ipam else set())
    assert ipam_calls(ipam_log) == ([f"ADD {want.ipam}"] if want.ipam else [])

    # The answer's format follows the config's cniVersion.
    version = want.version or json.loads(stdin)["cniVersion"]
    out = res.out
    assert out["cniVersion"] == version
    if version in ("0.1.0", "0.2.0"):
        assert out == {"cniVersion": version, "ip4": {"ip": IPAM_ADDRESS, "gateway": "192.0.2.1"}}
    else:
        assert [i["name"] for i in out["interfaces"]] == ["net1"]
    assert logging.getLevelName(logging.getLogger("sriov_cni").level) == want.log_level.upper()
    log = capsys.readouterr().err
    if "logFile" in json.loads(stdin):
        log = (tmp / "plugin.log").read_text()
        assert "allocated VF" in log
    assert _key_notes(log) == UNKNOWN_KEY_NOTES.get(case_id, [])

    # DEL with the same delivery gives everything back.
    gone = node.run(dict(env, CNI_COMMAND="DEL"), stdin)
    assert gone.rc == 0 and gone.stdout == "", gone.stdout
    assert node.picture() == before
    assert ipam_calls(ipam_log) == ([f"ADD {want.ipam}", f"DEL {want.ipam}"] if want.ipam else [])


# --- cniVersion before 0.3.0, with Debian's real host-local ----------------------


@pytest.mark.parametrize("version", [None, "", "0.1.0", "0.2.0"], ids=["missing", "empty", "0.1.0", "0.2.0"])
def test_old_versions_add_and_del_with_host_local(node: Node, version: str | None) -> None:
    pf = node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(vlan=5, ipam=node.host_local("10.41.0.0/24", routes=[{"dst": "0.0.0.0/0"}]))
    if version is None:
        del conf["cniVersion"]
    else:
        conf["cniVersion"] = version

    # DEL before any ADD (a runtime's cleanup after a failed ADD) succeeds too.
    assert node.cni("DEL", conf, netns=pod).rc == 0

    res = node.add(conf, netns=pod)

    assert res.out == {
        "cniVersion": version or "0.1.0",
        "ip4": {"ip": "10.41.0.2/24", "gateway": "10.41.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
    }
    assert addresses("net1", os.path.basename(pod)) == {"10.41.0.2/24"}
    assert node.fake.state[pf.name][0]["vlan"] == 5
    gone = node.cni("DEL", conf, netns=pod)
    assert gone.rc == 0 and gone.stdout == "", gone.stdout
    assert node.picture() == before
    assert ipam_reservations(node.ipam_dir, "sriov-net") == set()


@pytest.mark.parametrize("version", [None, "0.2.0"], ids=["missing", "0.2.0"])
def test_old_version_without_ipam_is_refused_before_anything_changes(node: Node, version: str | None) -> None:
    node.add_pf(1)
    pod = node.pod()
    before = node.picture()
    conf = node.conf(vlan=5)
    if version is None:
        del conf["cniVersion"]
    else:
        conf["cniVersion"] = version
    res = node.cni("ADD", conf, netns=pod)
    assert res.rc != 0 and res.code == 1, res.stdout
    assert res.out["cniVersion"] == (version or "0.1.0")
    assert node.picture() == before
    assert node.cni("DEL", conf, netns=pod).rc == 0


# --- key spellings and on/off values: what the log says ---------------------------


def test_other_spellings_are_logged_and_the_exact_one_wins(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    pf = node.add_pf(1)
    pod = node.pod()
    # Go also folds the Kelvin sign onto "k" and the long s onto "s".
    spellings: dict[str, Any] = {
        "VLAN": 20,
        "vlan": 10,
        "vlanqos": 3,
        "SpoofChk": "ON",
        "Trust": "on",
        "lin\u212a_\u017ftate": "disable",
    }
    conf = node.conf(**spellings)

    node.add(conf, netns=pod)

    log = capsys.readouterr().err
    state = node.fake.state[pf.name][0]
    assert (state["vlan"], state["qos"], state["spoofchk"], state["trust"]) == (10, 3, False, True)
    assert state["link_state"] == DISABLE
    assert "WARNING sriov [containerID=ctr1" in log and 'config: ignoring "VLAN": "vlan" is set too' in log
    assert 'config: reading "vlanqos" as "vlanQoS"' in log
    assert 'config: reading "SpoofChk" as "spoofchk"' in log
    assert 'config: reading "Trust" as "trust"' in log
    assert 'spoofchk "ON" turns spoofchk off' in log
    assert 'trust "on"' not in log


# --- keys no reader asks for, and log levels it does not know (issue #46) ---------


def test_a_misspelt_key_is_named_with_the_key_it_is_close_to(node: Node, capsys: pytest.CaptureFixture[str]) -> None:
    pf = node.add_pf(1)
    pod = node.pod()
    conf = node.conf(vlna=100, spoofchek="off", vf=0, logLevel="verbose")

    node.add(conf, netns=pod)

    log = capsys.readouterr().err
    assert node.fake.state[pf.name][0]["vlan"] == 0, "the misspelt vlan is not applied"
    assert _key_notes(log) == [
        'WARNING config: ignoring unknown keys: "vlna" (did you mean "vlan"?), "spoofchek" (did you mean "spoofchk"?), '
        '"vf"'
    ]
    assert (
        f"WARNING sriov [containerID=ctr1 netns={pod} ifname=net1] config: "
        'logLevel "verbose" is not one of "panic", "error", "warning", "info", "debug": logging at "info"'
    ) in log
    assert logging.getLogger("sriov_cni").level == logging.INFO


def test_every_key_the_spec_multus_and_the_reference_pass_is_known(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    pf = node.add_pf(1)
    pod = node.pod()
    # The CNI spec's keys, what Multus adds (deviceID, pciBusID), the
    # reference plugin's keys and this plugin's own, each set to a value
    # that changes nothing.
    keys: dict[str, Any] = {
        "args": {"cni": {}},
        "capabilities": {"mac": True},
        "runtimeConfig": {},
        "dns": {},
        "vlanQoS": 0,
        "vlan": 0,
        "vlanProto": "802.1q",
        "spoofchk": "",
        "trust": "",
        "link_state": "",
        "min_tx_rate": 0,
        "max_tx_rate": 0,
        "logLevel": "debug",
        "logFile": "",
        "rdma": "auto",
        "rdmaMemlock": "unlimited",
        "master": pf.name,
        "pfNames": [],
        "mac": "",
    }
    conf = node.conf(**keys)
    conf["prevResult"] = None
    conf["deviceID"] = conf["pciBusID"] = ""

    node.add(conf, netns=pod)

    assert _key_notes(capsys.readouterr().err) == []
