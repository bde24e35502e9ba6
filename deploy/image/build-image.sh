#!/usr/bin/env bash
# Build the image of the DaemonSet (deploy/kubernetes) from
# deploy/image/Containerfile with podman.
#
#   deploy/image/build-image.sh [--offline] [--oci-archive PATH] [IMAGE]
#
# IMAGE defaults to the name the manifests use, localhost/sriov-cni:VERSION
# (VERSION from sriov_cni/__init__.py). With a registry, build under its name and
# push it, then set that name in the images: of
# deploy/kubernetes/base/kustomization.yaml (or an overlay's):
#
#   deploy/image/build-image.sh registry.example.com/sriov-cni:0.1.0
#   podman push registry.example.com/sriov-cni:0.1.0
#
# --offline builds without a container registry and without TLS inside the
# build: the base image (debian:bookworm-slim) is bootstrapped with
# mmdebstrap from this machine's Debian apt sources (SOURCES, default
# /etc/apt/sources.list.d/debian.sources, else /etc/apt/sources.list) and
# the Python wheels are downloaded by this machine's pip, then mounted into
# the build for its RUN steps only; the image is the same as with a
# registry.
#
# --oci-archive also writes the image to PATH as an OCI archive, which
# `ctr -n k8s.io images import` loads into a node's containerd without a
# registry.
#
# Rebuilds only what changed: podman reuses each layer whose inputs (the
# copied files, the command) are unchanged; the offline base is bootstrapped
# again only when SOURCES changes, the wheels only when the pinned
# requirements (requirements.txt, build-requirements.txt) do.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
offline=0
archive=""
while [ $# -gt 0 ]; do
    case $1 in
        --offline) offline=1; shift ;;
        --oci-archive) archive=${2:?--oci-archive needs a PATH}; shift 2 ;;
        -*) echo "build-image: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/sriov_cni/__init__.py")
image=${1:-localhost/sriov-cni:$version}
# The name FROM resolves to: podman expands a short name to docker.io's
# library, as a registry pull would.
base=docker.io/library/debian:bookworm-slim
cache=${XDG_CACHE_HOME:-$HOME/.cache}/sriov-cni-image

log() { echo "build-image: $*" >&2; }

build_opts=(--file "$repo/deploy/image/Containerfile" --tag "$image"
            # RUN steps use the builder's network: podman's default bridge
            # needs a CNI network setup that a build host may not have.
            --network host)

# A builder that is itself a container may lack CAP_SYS_RESOURCE; podman's
# default rlimits (over a million open files) are then above what it may
# set and every RUN step fails in runc. Give the build modest ones.
capeff=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
if (( (16#$capeff >> 24 & 1) == 0 )); then
    build_opts+=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
fi

sha() { sha256sum "$@" | cut -c1-16; }

if [ "$offline" -eq 1 ]; then
    sources=${SOURCES:-}
    if [ -z "$sources" ]; then
        sources=/etc/apt/sources.list.d/debian.sources
        [ -f "$sources" ] || sources=/etc/apt/sources.list
    fi
    base_key=$(cat "$sources" | sha)
    if [ "$(podman image inspect --format '{{index .Labels "sriov-cni.sources"}}' "$base" 2>/dev/null)" != "$base_key" ]; then
        log "bootstrapping $base from $sources"
        # minbase without documentation, as Debian's slim images are made.
        mmdebstrap --variant=minbase --quiet \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            bookworm - "$sources" \
            | podman import --change CMD=/bin/bash \
                --change "LABEL=sriov-cni.sources=$base_key" - "$base" >/dev/null
    fi
    build_opts+=(--pull=never)

    # What pip installs in the build: the pinned wheels of both stages,
    # checked against their hashes here and again in the build.
    reqs=("$repo/deploy/image/requirements.txt" "$repo/deploy/image/build-requirements.txt")
    # The build's Python is bookworm's 3.11; the wheels must fit it.
    wheels=$cache/wheels-$(cat "${reqs[@]}" | sha)
    if [ ! -d "$wheels" ]; then
        log "downloading wheels into $wheels"
        rm -rf "$wheels.tmp"
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
            --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
            --platform "manylinux2014_$(uname -m)" --dest "$wheels.tmp" -r "${reqs[0]}" -r "${reqs[1]}"
        mv "$wheels.tmp" "$wheels"
    fi
    mkdir -p "$cache"
    printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$cache/pip.conf"
    # Mounted for the RUN steps only: nothing of it stays in the image.
    build_opts+=(--volume "$wheels:/wheels:ro" --volume "$cache/pip.conf:/etc/pip.conf:ro")
fi

log "building $image"
podman build --quiet "${build_opts[@]}" "$repo" >/dev/null

if [ -n "$archive" ]; then
    # Written again only for another image: the archive's sidecar holds the
    # ID of the image it was saved from.
    id=$(podman image inspect --format '{{.Id}}' "$image")
    if [ "$(cat "$archive.id" 2>/dev/null)" != "$id" ]; then
        log "saving $image to $archive"
        rm -f "$archive.id"
        podman save --quiet --format oci-archive --output "$archive.tmp" "$image"
        mv "$archive.tmp" "$archive"
        echo "$id" >"$archive.id"
    fi
fi
