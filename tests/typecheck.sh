#!/usr/bin/env bash
# mypy --strict over the package, then over each test directory on its own.
# The test directories import their helpers by bare module name (pluginlib,
# nodetree, vmlib, ...) and several have a conftest.py, so checked together
# the module names clash; each is checked with the directories it puts on
# sys.path itself as its MYPYPATH (tests/ itself, where the helpers shared
# across directories live, only for the directories importing them: on every
# path it would make stress.py both "stress" and "stress.stress").  Exits
# non-zero if any check fails, after running them all.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

status=0
echo "typecheck: sriov_cni"
python3 -m mypy || status=1

echo "typecheck: tests/conftest.py, tests/hangipam.py, tests/daemonprocs.py"
python3 -m mypy --strict --explicit-package-bases --cache-dir .mypy_cache/tests tests/conftest.py tests/hangipam.py tests/daemonprocs.py || status=1

for dir in tests/*/; do
    dir=${dir%/}
    name=${dir#tests/}
    # The sibling directories a directory's modules add to sys.path.
    case $name in
        bench)  extra=tests/plugin:tests/node:tests/daemon:tests ;;
        stress) extra=tests/plugin:tests/vm ;;
        daemon) extra=tests:tests/bench:tests/plugin ;;
        plugin) extra=tests ;;
        vm)     extra=tests ;;
        *)      extra="" ;;
    esac
    echo "typecheck: $dir"
    MYPYPATH="$dir${extra:+:$extra}" python3 -m mypy --strict --explicit-package-bases \
        --cache-dir ".mypy_cache/tests-$name" "$dir" || status=1
done

exit "$status"
