#!/bin/bash
# The main job of sriov-cni on one node, step by step, for a person to watch:
# VFs created by `sriov-cni setup`, two pods (network namespaces) given VFs
# with addresses by the sriov plugin, a ping between them through the NIC,
# the pool shown, both pods deleted, two new pods on the same VFs pinging
# each other too, and the VFs back as they were.
#
# Runs inside the QEMU guest (deploy/demo/demo.sh) or on a node with a real
# SR-IOV NIC:   sudo deploy/demo/demo-node.sh [--pf ens1f0]
# It runs sriov-cni from a virtualenv of its own, .venv in the checkout
# (SRIOV_CNI_VENV to put it elsewhere), made on the first run: that needs
# python3-venv, gcc, libc6-dev and make (the package's build compiles the
# shim), and PyPI for what the system's Python lacks. It creates 2
# VFs on the PF if it has none. At exit, also on an error or Ctrl-C, it puts
# back what it changed on the node: the VF count, the PF's IRQ affinities,
# RPS/XPS masks and flow counts, MTU and link state, and the host's RFS table
# size.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
pf=""
[ "${1:-}" = "--pf" ] && pf=${2:?--pf needs a PF name}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

# The system's Python may lack the dependencies or have older ones (Debian
# 12's pyroute2 and filelock are below what sriov-cni needs). The venv sees
# the system's packages, so pip fetches only what those do not satisfy;
# setuptools >= 77 builds the package (Debian 12 has 66).
venv=${SRIOV_CNI_VENV:-$here/.venv}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$here/sriov_cni/__init__.py")
if [ "$("$venv/bin/sriov-cni" --version 2>/dev/null)" != "sriov-cni $version" ]; then
    step "0. sriov-cni $version into the virtualenv $venv"
    python3 -m venv --system-site-packages "$venv" \
        || { echo "demo: cannot make a virtualenv (on Debian/Ubuntu: apt install python3-venv)" >&2; exit 1; }
    run "$venv/bin/pip" install --quiet --disable-pip-version-check "setuptools>=77"
    run "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation "$here"
fi
export PATH="$venv/bin:$PATH"

if [ -z "$pf" ]; then
    for dev in /sys/class/net/*; do
        if [ -e "$dev/device/sriov_totalvfs" ]; then pf=$(basename "$dev"); break; fi
    done
fi
[ -n "$pf" ] || { echo "demo: no SR-IOV PF on this machine (give --pf)"; exit 1; }
[ -e "/sys/class/net/$pf/device/sriov_numvfs" ] || { echo "demo: $pf is not an SR-IOV PF"; exit 1; }

work=$(mktemp -d)
state="$work/state"
saved="$work/saved"

# What setup and the pods may change on the node, as "file value" lines, in
# the order they are written back: the VF count first, as a driver may
# reset its queues when it changes; the link state last.
save_node() {
    local net=/sys/class/net/$pf irq f v
    echo "$net/device/sriov_numvfs $(cat "$net/device/sriov_numvfs")"
    for irq in "$net"/device/msi_irqs/*; do
        f=/proc/irq/${irq##*/}/smp_affinity_list
        [ -r "$f" ] && echo "$f $(cat "$f")"
    done
    for f in "$net"/queues/rx-*/rps_cpus "$net"/queues/rx-*/rps_flow_cnt "$net"/queues/tx-*/xps_cpus \
             /proc/sys/net/core/rps_sock_flow_entries "$net/mtu"; do
        # Some files refuse reads on some devices (xps_cpus of a single
        # queue device): what cannot be read was not changed by us either.
        [ -r "$f" ] && v=$(cat "$f" 2>/dev/null) && echo "$f $v"
    done
    echo "link $(( $(cat "$net/flags") & 1 ))"
}
restore_node() {
    local f v
    while read -r f v; do
        case $f in
            link) [ "$v" = 1 ] && ip link set "$pf" up || ip link set "$pf" down ;;
            */sriov_numvfs)
                # A count goes through 0; unchanged, it is left alone.
                if [ "$(cat "$f")" != "$v" ]; then echo 0 >"$f"; [ "$v" = 0 ] || echo "$v" >"$f"; fi ;;
            # An IRQ or a queue gone with the VFs has nothing to restore.
            *) [ -e "$f" ] && [ "$(cat "$f")" != "$v" ] && echo "$v" >"$f" ;;
        esac
    done <"$saved"
}
cleanup() {
    set +e
    for p in pod-a pod-b pod-c pod-d; do ip netns del "$p" 2>/dev/null; done
    [ -n "${helper_pid:-}" ] && kill "$helper_pid" 2>/dev/null && wait "$helper_pid" 2>/dev/null
    if [ -s "$saved" ]; then
        restore_node 2>/dev/null
        echo "demo: $pf is back as it was"
    fi
    rm -rf "$work"
}
trap cleanup EXIT
# Ctrl-C and a kill end the demo through the same cleanup.
trap 'exit 130' INT
trap 'exit 143' TERM
save_node >"$saved.tmp" && mv "$saved.tmp" "$saved"

step "1. Create the VFs: sriov-cni setup"
if [ "$(cat "/sys/class/net/$pf/device/sriov_numvfs")" = 0 ]; then
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
        CNI_PATH="$venv/bin" sriov <<<"$conf"
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
