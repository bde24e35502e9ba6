#!/bin/bash
# Install sriov-cni on a node without Kubernetes tooling (bootstrap, or
# nodes managed by configuration management): the static shim as sriov and
# sriov-ipam in /opt/cni/bin (what the container runtime runs), a
# virtualenv under /opt/sriov-cni for the daemon, and two systemd units:
# sriov-cni-setup (VFs and tuning at boot) and sriov-cni-daemon (runs the
# CNI calls the shim forwards). Needs gcc, libc6-dev and make (pip's build
# of the package compiles the shim) and python3 >= 3.11 with venv.
#   sudo deploy/systemd/install-node.sh [--no-start]
set -euo pipefail
PREFIX=${PREFIX:-/opt/sriov-cni}
CNI_BIN=${CNI_BIN:-/opt/cni/bin}
src=$(cd "$(dirname "$0")/../.." && pwd)

[ "$(id -u)" = 0 ] || { echo "install-node.sh: run as root" >&2; exit 1; }
python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install --quiet "$src"
"$PREFIX/venv/bin/sriov-cni" install-cni --dest "$CNI_BIN" --create-dest
install -d -m 0755 /etc/sriov-cni
install -m 0644 "$src/deploy/systemd/node-config.example.yaml" /etc/sriov-cni/node.yaml.example
install -m 0644 "$src/deploy/systemd/sriov-cni-setup.service" "$src/deploy/systemd/sriov-cni-daemon.service" /etc/systemd/system/
systemctl daemon-reload
units=(sriov-cni-daemon.service)
# Setup needs this node's own config: the example names PFs this node may
# not have, and a failing boot-time setup helps nobody.
if [ -f /etc/sriov-cni/node.yaml ]; then
    units+=(sriov-cni-setup.service)
else
    echo "no /etc/sriov-cni/node.yaml yet: write it (see node.yaml.example), then" \
         "systemctl enable --now sriov-cni-setup.service"
fi
if [ "${1:-}" != "--no-start" ]; then
    systemctl enable --now "${units[@]}"
fi
echo "sriov-cni installed: the shim in $CNI_BIN, the daemon in $PREFIX"
