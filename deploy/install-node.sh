#!/bin/bash
# Install sriov-cni on a node without Kubernetes tooling (bootstrap, or
# nodes managed by configuration management): a virtualenv under
# /opt/sriov-cni, the CNI executables in /opt/cni/bin, and two systemd
# units: sriov-cni-setup (VFs and tuning at boot) and sriov-cni-helper
# (the warm helper that serves CNI calls).
#   sudo deploy/install-node.sh [--no-start]
set -euo pipefail
PREFIX=${PREFIX:-/opt/sriov-cni}
CNI_BIN=${CNI_BIN:-/opt/cni/bin}
src=$(cd "$(dirname "$0")/.." && pwd)

[ "$(id -u)" = 0 ] || { echo "install-node.sh: run as root" >&2; exit 1; }
python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install --quiet "$src"
"$PREFIX/venv/bin/sriov-cni" install-cni --dest "$CNI_BIN"
install -d -m 0755 /etc/sriov-cni
install -m 0644 "$src/deploy/node-config.example.yaml" /etc/sriov-cni/node.yaml.example
install -m 0644 "$src/deploy/sriov-cni-setup.service" "$src/deploy/sriov-cni-helper.service" /etc/systemd/system/
systemctl daemon-reload
units=(sriov-cni-helper.service)
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
echo "sriov-cni installed: CNI executables in $CNI_BIN"
