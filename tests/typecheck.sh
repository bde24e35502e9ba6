#!/usr/bin/env bash
# mypy --strict over the package, then over the tests the way pytest imports
# them.  The shared helpers are the package tests.support, named from the
# repository root; a test directory's own modules (its conftest.py, helpers,
# other test modules) are imported by bare name, since pytest puts the
# directory on sys.path, so each directory is checked on its own with itself
# as MYPYPATH (checked together, their conftest.py files would clash).
# Exits non-zero if any check fails, after running them all.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

status=0
echo "typecheck: sriov_cni"
python3 -m mypy || status=1

echo "typecheck: tests/*.py, tests/support"
python3 -m mypy --strict --explicit-package-bases --cache-dir .mypy_cache/tests tests/*.py tests/support || status=1

for dir in tests/*/; do
    dir=${dir%/}
    name=${dir#tests/}
    [ "$name" = support ] && continue
    echo "typecheck: $dir"
    MYPYPATH="$dir" python3 -m mypy --strict --explicit-package-bases \
        --cache-dir ".mypy_cache/tests-$name" "$dir" || status=1
done

exit "$status"
