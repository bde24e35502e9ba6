#!/bin/bash
# Watch sriov-cni do its main job on a machine without an SR-IOV NIC: boots a
# QEMU guest with an emulated Intel 82576 (igb, SR-IOV) and runs
# deploy/demo/demo-node.sh inside it. Installs what it needs (QEMU, the guest
# kernel) on first use.   sudo deploy/demo/demo.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" = 0 ] || { echo "demo.sh: run as root (sudo deploy/demo/demo.sh)" >&2; exit 1; }
"$here/tests/setup-host.sh"
cd "$here"
exec python3 tests/vm/rig.py --pfs 1 -- bash deploy/demo/demo-node.sh
