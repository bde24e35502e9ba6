#!/usr/bin/env bash
# Pin the Python packages the image is built from, with their hashes:
#   requirements.txt        what the image installs besides sriov-cni
#                           (pyproject.toml's dependencies, resolved);
#   build-requirements.txt  the build backend of the wheel stage
#                           (pyproject.toml's build-system requires).
# Each names the newest releases pyproject.toml allows today, with the sha256
# of every wheel pip may pick for bookworm's Python 3.11 on x86_64 and
# aarch64. The image build installs only these (pip --require-hashes), so
# two builds of one commit get the same packages. Run after a change of
# pyproject.toml's dependencies, and to take newer releases:
#   deploy/image/lock-requirements.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=(manylinux2014_x86_64 manylinux2014_aarch64)

# download DIR PLATFORM REQ...: the wheels pip resolves REQ to for PLATFORM.
download() {
    local dest=$1 platform=$2
    shift 2
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
        --python-version 3.11 --implementation cp --abi cp311 --platform "$platform" \
        --dest "$dest" "$@"
}

# lock FILE HEADER REQ...: FILE pins what REQ resolves to on the first
# platform, hashed for every platform.
lock() {
    local file=$1 header=$2
    shift 2
    local first="$work/${platforms[0]}"
    download "$first" "${platforms[0]}" "$@"
    # name==version of every wheel: the file name's first two fields.
    mapfile -t pins < <(for w in "$first"/*.whl; do
        basename "$w" | awk -F- '{ print $1 "==" $2 }'
    done | sort -u)
    for platform in "${platforms[@]:1}"; do
        download "$work/$platform" "$platform" --no-deps "${pins[@]}"
    done
    {
        printf '%s\n' "$header"
        for pin in "${pins[@]}"; do
            local name=${pin%%==*}
            printf '%s' "$pin"
            sha256sum "$work"/*/"$name"-"${pin##*==}"-*.whl | cut -d' ' -f1 | sort -u \
                | while read -r hash; do printf ' \\\n    --hash=sha256:%s' "$hash"; done
            printf '\n'
        done
    } >"$file"
    rm -rf "${work:?}"/*
}

mapfile -t runtime < <(python3 - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(*tomllib.load(f)["project"]["dependencies"], sep="\n")
PY
)
mapfile -t build < <(python3 - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print(*tomllib.load(f)["build-system"]["requires"], sep="\n")
PY
)
lock "$here/requirements.txt" "# Written by deploy/image/lock-requirements.sh from pyproject.toml's dependencies." "${runtime[@]}"
lock "$here/build-requirements.txt" "# Written by deploy/image/lock-requirements.sh from pyproject.toml's build-system requires." "${build[@]}"
