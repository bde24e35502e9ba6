#!/bin/bash
# The main job of sriov-cni on one node, step by step, for a person to watch:
# VFs created by `sriov-cni setup`, two pods (network namespaces) given VFs
# with addresses by the sriov plugin, a ping between them through the NIC,
# the pool shown, both pods deleted, two new pods on the same VFs pinging
# each other too, and the VFs back as they were.
#
# Runs inside the QEMU guest (deploy/demo/demo.sh) or on a node with a real
# SR-IOV NIC:   sudo deploy/demo/demo-node.sh [--pf ens1f0]
# On a real node it creates 2 VFs on that PF if it has none, and removes
# them again at the end only if it created them.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="$here/bin:$PATH"
pf=""
[ "${1:-}" = "--pf" ] && pf=${2:?--pf needs a PF name}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

if [ -z "$pf" ]; then
    for dev in /sys/class/net/*; do
        if [ -e "$dev/device/sriov_totalvfs" ]; then pf=$(basename "$dev"); break; fi
    done
fi
[ -n "$pf" ] || { echo "demo: no SR-IOV PF on this machine (give --pf)"; exit 1; }

work=$(mktemp -d)
state="$work/state"
cleanup() {
    set +e
    for p in pod-a pod-b pod-c pod-d; do ip netns del "$p" 2>/dev/null; done
    [ -n "${helper_pid:-}" ] && kill "$helper_pid" 2>/dev/null
    if [ "${created_vfs:-0}" = 1 ]; then echo 0 > "/sys/class/net/$pf/device/sriov_numvfs"; fi
    rm -rf "$work"
}
trap cleanup EXIT

step "1. Create the VFs: sriov-cni setup"
created_vfs=0
if [ "$(cat "/sys/class/net/$pf/device/sriov_numvfs")" = 0 ]; then
    created_vfs=1
    cat > "$work/node.yaml" <<YAML
pfs:
  - pf: $pf
    numVfs: 2
    tuning:
      irqCpus: local
      rps: true
YAML
    run cat "$work/node.yaml"
    # In the throw-away guest, setup records its tuning where the plugin reads
    # it (/run/sriov-cni/node.json), so each VF is pinned when it reaches a
    # pod; on a real node the demo keeps its record to itself.
    state_opt=(--state-file "$work/node-state.json")
    [ "${SRIOV_CNI_VM:-}" = 1 ] && state_opt=()
    run sriov-cni setup --config "$work/node.yaml" --data-dir "$state" "${state_opt[@]}"
else
    echo "$pf already has VFs; using them"
fi
run sriov-cni status --data-dir "$state"

step "2. Start the daemon (optional here: without it the Python sriov runs each call in process)"
sock="$work/run/plugin.sock"
sriov-cni daemon --socket "$sock" 2>/dev/null &
helper_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || echo "the daemon is not listening on $sock after 10 s: the calls run in process"
export SRIOV_CNI_SOCKET="$sock"

conf=$(cat <<JSON
{"cniVersion": "1.0.0", "name": "demo-net", "type": "sriov", "pfNames": ["$pf"],
 "dataDir": "$state", "spoofchk": "on",
 "ipam": {"type": "sriov-ipam", "subnet": "10.56.0.0/24", "dataDir": "$work/ipam"}}
JSON
)
cni() {  # cni COMMAND POD
    CNI_COMMAND=$1 CNI_CONTAINERID=$2 CNI_NETNS=/var/run/netns/$2 CNI_IFNAME=net1 \
        CNI_PATH="$here/bin" sriov <<<"$conf"
}

add_pods() {  # add_pods POD...
    for p in "$@"; do
        run ip netns add "$p"
        echo "\$ CNI_COMMAND=ADD CNI_CONTAINERID=$p ... sriov"
        cni ADD "$p"
    done
    for p in "$@"; do run ip netns exec "$p" ip -br addr show net1; done
}
ping_pods() {  # ping_pods POD-A POD-B: each pings the other
    # No wait for the link: ADD returns once the VF has carrier, and setup
    # opened each new VF once, so a VF's first pod does not meet its first reset.
    local from to addr
    for from in "$1" "$2"; do
        to=$([ "$from" = "$1" ] && echo "$2" || echo "$1")
        addr=$(ip netns exec "$to" ip -4 -o addr show net1 | awk '{print $4}' | cut -d/ -f1)
        run ip netns exec "$from" ping -c 3 -W 2 "$addr"
    done
}
delete_pods() {  # delete_pods POD...
    for p in "$@"; do
        echo "\$ CNI_COMMAND=DEL CNI_CONTAINERID=$p ... sriov"
        cni DEL "$p"
        run ip netns del "$p"
    done
}

step "3. Two pods, each gets a VF with an address (CNI ADD)"
echo "$conf"
add_pods pod-a pod-b

step "4. pod-a and pod-b ping each other through the NIC's own switch"
ping_pods pod-a pod-b

step "5. The pool: which VF belongs to which pod"
run sriov-cni status --data-dir "$state"

step "6. Delete both pods (CNI DEL): the VFs go back as they were"
delete_pods pod-a pod-b
run ip -d link show "$pf"

step "7. Two new pods get the same VFs, and ping each other too"
add_pods pod-c pod-d
run sriov-cni status --data-dir "$state"
ping_pods pod-c pod-d
delete_pods pod-c pod-d
run ip -br link
run sriov-cni status --data-dir "$state"
echo
echo "demo finished: VFs allocated, used, returned, and used again"
