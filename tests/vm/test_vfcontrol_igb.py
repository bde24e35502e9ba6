"""The host tests' PF side, FakeVfControl, answers as KernelVfControl does on igb.

The plugin's host tests have no SR-IOV NIC, so FakeVfControl stands in for
the PF side there.  Each case here runs against both: the fake on the host,
the kernel's on a fresh igb PF of two VFs in the guest, so the fake cannot
drift from what the driver and the kernel answer.  The fake is set up to
refuse what igb refuses (a VF's link state, EOPNOTSUPP), as the host tests
set it up for a driver that cannot do something.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sriov_cni.kernel import netlink, vfsettings
from sriov_cni.kernel.vfcontrol import KernelVfControl
from sriov_cni.kernel.vfsettings import VLAN_PROTO_8021Q, PfSettings, Rate, VfControl, Vlan
from tests.support.fakes import FakeVfControl, default_vf_state, settings_of

MAC = "02:00:00:5a:01:02"

PfSide = tuple[VfControl, str]


@pytest.fixture(params=["fake", pytest.param("igb", marks=pytest.mark.sriov_vm)])
def pf_side(request: pytest.FixtureRequest) -> Iterator[PfSide]:
    """A PF with two fresh VFs, and the VfControl to reach it."""
    if request.param == "fake":
        fake = FakeVfControl()
        fake.add_pf("eth0", 2)
        fake.refuse["link_state"] = netlink.NotSupported("setting link_state: Operation not supported", 95)
        yield fake, "eth0"
        return
    pf = request.getfixturevalue("igb_pfs")[0]
    request.getfixturevalue("sriov").enable(pf, 2)
    vfc = KernelVfControl()
    try:
        yield vfc, pf
    finally:
        vfc.close()


def fresh() -> PfSettings:
    return settings_of(default_vf_state(0))


def test_fresh_vfs_read_as_the_fake_starts_them(pf_side: PfSide) -> None:
    vfc, pf = pf_side
    assert vfc.vfs(pf) == {0: fresh(), 1: fresh()}


def test_each_setting_reads_back_on_its_vf_alone(pf_side: PfSide) -> None:
    vfc, pf = pf_side
    vfc.set_mac(pf, 1, MAC)
    vfc.set_vlan(pf, 1, 100, 3, VLAN_PROTO_8021Q)
    vfc.set_spoofchk(pf, 1, False)
    vfc.set_trust(pf, 1, True)
    vfc.set_rate(pf, 1, 0, 100)
    assert vfc.vfs(pf) == {0: fresh(), 1: PfSettings(Vlan(100, 3, VLAN_PROTO_8021Q), MAC, Rate(0, 100), False, True, 0)}


def test_settings_go_back_to_a_fresh_vfs(pf_side: PfSide) -> None:
    vfc, pf = pf_side
    vfc.set_vlan(pf, 0, 100, 3, VLAN_PROTO_8021Q)
    vfc.set_trust(pf, 0, True)
    vfc.set_vlan(pf, 0, 0, 0, VLAN_PROTO_8021Q)
    vfc.set_trust(pf, 0, False)
    assert vfc.vfs(pf)[0] == fresh()


def test_an_unknown_pf_is_link_not_found(pf_side: PfSide) -> None:
    vfc, _ = pf_side
    with pytest.raises(netlink.LinkNotFound):
        vfc.vfs("nosuchpf0")
    with pytest.raises(netlink.LinkNotFound):
        vfc.set_trust("nosuchpf0", 0, True)


def test_a_vf_beyond_the_pf_is_an_invalid_argument(pf_side: PfSide) -> None:
    vfc, pf = pf_side
    with pytest.raises(netlink.InvalidArgument):
        vfc.set_mac(pf, 7, MAC)
    assert vfc.vfs(pf) == {0: fresh(), 1: fresh()}


@pytest.mark.parametrize("vlan, qos", [(4096, 0), (100, 8)])
def test_a_vlan_or_qos_out_of_range_is_an_invalid_argument(pf_side: PfSide, vlan: int, qos: int) -> None:
    vfc, pf = pf_side
    with pytest.raises(netlink.InvalidArgument):
        vfc.set_vlan(pf, 0, vlan, qos, VLAN_PROTO_8021Q)
    assert vfc.vfs(pf)[0] == fresh()


def test_a_refused_setting_changes_nothing(pf_side: PfSide) -> None:
    vfc, pf = pf_side
    with pytest.raises(netlink.NotSupported):
        vfc.set_link_state(pf, 0, vfsettings.LINK_STATE_DISABLE)
    assert vfc.vfs(pf)[0] == fresh()
