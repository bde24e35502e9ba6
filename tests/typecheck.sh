#!/usr/bin/env bash
# mypy --strict over the package, then over all the tests in one pass: each
# test directory is a package (tests.ipam, tests.vm, ...), and a module
# imports what it shares by its package path (tests.support.daemonlib,
# tests.vm.vmlib), never a test module nor a neighbour by bare name (the
# benchmarks too, though they run as programs by path).
# Exits non-zero if either check fails, after running both.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

status=0
echo "typecheck: sriov_cni"
python3 -m mypy || status=1

echo "typecheck: tests"
python3 -m mypy --strict --explicit-package-bases --cache-dir .mypy_cache/tests tests || status=1

exit "$status"
