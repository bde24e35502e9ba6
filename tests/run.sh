#!/usr/bin/env bash
# The test command: mypy --strict over the package and the tests, ruff's
# format check and linter, host tests, then the driver tests (marker sriov_vm)
# in one boot of the igb QEMU guest (tests/vm/rig.py), and the RDMA ones in a
# second boot on a newer kernel.  Needs root.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "run.sh: must run as root (sudo tests/run.sh)" >&2
    exit 1
fi
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

bash tests/setup-host.sh

# A type error or a lint finding fails the run, but the tests still run and
# report.
echo "=== type check (mypy --strict) ==="
type_status=0
bash tests/typecheck.sh || type_status=$?

echo "=== format and lint (ruff) ==="
lint_status=0
python3 -m ruff format --check --quiet . || lint_status=1
python3 -m ruff check --quiet . || lint_status=1

echo "=== host tests (not sriov_vm) ==="
host_status=0
python3 -m pytest -ra -m "not sriov_vm" || host_status=$?

echo "=== driver tests (sriov_vm) in the igb guest ==="
vm_status=0
started=$(date +%s)
# The guest cannot build the DaemonSet's image: it is built here, and
# tests/vm/test_kubernetes_igb.py imports this archive into the guest's
# containerd.  Unchanged inputs make this a few seconds.
bash deploy/image/build-image.sh --offline \
    --oci-archive "${SRIOV_CNI_VM_CACHE:-/var/cache/sriov-cni-vm}/sriov-cni-image.tar" || vm_status=$?
# Only the directories holding guest tests (tests/conftest.py GUEST_DIRS).
python3 tests/vm/rig.py --timeout 3600 -- python3 -m pytest -ra -v -m sriov_vm tests/vm tests/stress || vm_status=$?
python3 tests/vm/rig.py --wire --timeout 900 -- python3 -m pytest -ra -v -m sriov_vm tests/vm/test_wire_igb.py || vm_status=$?
# A guest whose igb VFs never come up (more memory than QEMU's igb handles,
# see rig.py): ADD sets each VF aside and fails naming them.
SRIOV_CNI_VM_BROKEN_VFS=1 python3 tests/vm/rig.py --memory 3072 --allow-broken-vfs --timeout 900 -- \
    python3 -m pytest -ra -v -m sriov_vm tests/vm/test_aside_igb.py || vm_status=$?
# tests/vm/test_nri_rdma.py runs Debian sid's containerd 2.x (NRI), fetched
# here once into the rig's cache.
python3 -m tests.vm.containerd2 || vm_status=$?
# The RDMA tests need a newer kernel than Debian 12's: one more boot, on
# Linux 7.3 (Debian experimental, pinned in rig.py), runs the RDMA modules
# (exclusive mode, Soft-RoCE, a PCI-parented device, NRI with containerd
# 2.x) and the one kind of device a pod can build on its VF that Debian 12's
# kernel lacks (HSR).  Their Linux 7.2 variants (rig.py --kernel sid) are
# left to a run by hand.
# The RDMA stub module (a VF's own RDMA device, with the VF's PCI function as
# its parent, as mlx5's) is built here against that kernel's headers; the
# guest sees this machine's files.
python3 -m tests.vm.rdmastub || vm_status=$?
python3 tests/vm/rig.py --kernel experimental --timeout 2400 -- \
    python3 -m pytest -ra -v -m sriov_vm tests/vm/test_rdma_kernel.py tests/vm/test_rdma_soft.py \
    tests/vm/test_rdma_stub.py tests/vm/test_nri_rdma.py \
    "tests/vm/test_riders_igb.py::test_del_removes_every_kind_a_pod_can_build_on_its_vf[hsr]" || vm_status=$?
python3 tests/vm/rig.py --kernel experimental --wire --peer --timeout 900 -- python3 -m pytest -ra -v -m sriov_vm tests/vm/test_wire_igb.py -k two_nodes || vm_status=$?
echo "run.sh: guest part took $(( $(date +%s) - started )) s"

echo "run.sh: type check exit $type_status, lint exit $lint_status, host tests exit $host_status, guest tests exit $vm_status"
if [ "$type_status" -ne 0 ] || [ "$lint_status" -ne 0 ] || [ "$host_status" -ne 0 ] || [ "$vm_status" -ne 0 ]; then
    exit 1
fi
