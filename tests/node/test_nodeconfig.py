from __future__ import annotations

from pathlib import Path

import pytest

from sriov_cni.node.config import NodeConfigError, PfSpec, TuningSpec, load, parse


def test_full_config() -> None:
    config = parse(
        """
pfs:
  - pf: ens1f0
    numVfs: 7
    mtu: 9000
    tuning:
      irqCpus: 2-5
      excludeCpus: 3
      rps: true
      rfsFlowEntries: 32768
      xps: true
  - pf: "0000:af:00.1"
    numVfs: 0
    vfDriver: vfio-pci
"""
    )
    assert config.pfs == [
        PfSpec("ens1f0", 7, 9000, "kernel", TuningSpec([2, 3, 4, 5], [3], True, None, 32768, True)),
        PfSpec("0000:af:00.1", 0, None, "vfio-pci", None),
    ]


def test_irqbalance_is_banned_by_default() -> None:
    assert parse("pfs: [{pf: eth0, numVfs: 1}]").irqbalance == "ban"
    assert parse("irqbalance: stop\npfs: [{pf: eth0, numVfs: 1}]").irqbalance == "stop"


def test_local_is_the_default_irq_cpus() -> None:
    spec = parse("pfs: [{pf: eth0, numVfs: 1, tuning: {}}]").pfs[0].tuning
    assert spec == TuningSpec(None, [], False, None, 0, False)


@pytest.mark.parametrize(
    "text, message",
    [
        ("pfs: [{pf: eth0}]", "pfs[0].numVfs: required"),
        ("pfs: [{pf: eth0, numVfs: -1}]", "pfs[0].numVfs: must be an integer from 0 to 65535, got -1"),
        # Values as JSON (true, null), not as Python (True, None).
        ("pfs: [{pf: eth0, numVfs: yes}]", "pfs[0].numVfs: must be an integer from 0 to 65535, got true"),
        (
            "pfs: [{pf: eth0, numVfs: 2, vfDriver: null}]",
            "pfs[0].vfDriver: must be one of kernel, vfio-pci, uio_pci_generic, got null",
        ),
        ("pfs: [{pf: eth0, numVfs: 2, mtu: 20}]", "pfs[0].mtu: must be an integer from 68"),
        ("pfs: [{pf: eth0, numVfs: 2, vfDriver: uio}]", "pfs[0].vfDriver: must be one of kernel, vfio-pci"),
        ("pfs: [{pf: eth0, numVfs: 2, numvfs: 3}]", "pfs[0].numvfs: unknown field"),
        ("pfs: [{pf: eth0, numVfs: 2, tuning: {irqCpus: 3-1}}]", 'pfs[0].tuning.irqCpus: "3-1" is not a CPU range'),
        (
            "pfs: [{pf: eth0, numVfs: 2, tuning: {rfsFlowEntries: 64}}]",
            "pfs[0].tuning.rfsFlowEntries: RFS steers through RPS",
        ),
        ("pfs: [{pf: eth0, numVfs: 2, tuning: {rpsCpus: 1}}]", "pfs[0].tuning.rpsCpus: given while rps is off"),
        ("pfs: [{pf: eth0, numVfs: 2, tuning: {xps: 1}}]", "pfs[0].tuning.xps: must be true or false"),
        ("pfs: [{pf: eth0, numVfs: 2, adminMacs: yes please}]", "pfs[0].adminMacs: must be true or false"),
        ("pfs: [{pf: eth0, numVfs: 1}, {pf: eth0, numVfs: 2}]", "pfs[1].pf: eth0 is already configured in pfs[0]"),
        ("pfs: []", "pfs: must be a non-empty list"),
        ("nodes: []", "config.nodes: unknown field"),
        (
            "irqbalance: disable\npfs: [{pf: eth0, numVfs: 1}]",
            'irqbalance: must be one of ban, stop, leave, got "disable"',
        ),
        ("pfs: [", "not valid YAML at line 1"),
    ],
)
def test_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(NodeConfigError) as info:
        parse(text)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_the_deployed_example_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "node-config.example.yaml"
    config = load(example)
    assert [(p.pf, p.num_vfs, p.vf_driver) for p in config.pfs] == [
        ("ens1f0", 8, "kernel"),
        ("0000:3b:00.1", 4, "vfio-pci"),
    ]
    assert config.irqbalance == "ban"
