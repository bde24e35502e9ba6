"""Which modules import which: the layering rules, and who loads pyroute2.

The kernel layer talks to the kernel and knows nothing above it; the
contracts several products share (the CNI protocol, safe paths, GC's
attachment list, the node state file, the VF store and a VF's state) sit at
the package top; the products (the ``sriov`` plugin, ``sriov-ipam``, the node
command, the daemon) use those and not each other, except where one runs
another; the command line sits above them all.  An import that breaks a rule
fails here, not in a review.

Parsing a config, choosing a VF and the tuning hook's checks run on every
CNI call, some before any netlink request (or without one, for a refused
config); loading pyroute2 for them is paid for nothing.
"""

from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import sriov_cni

PACKAGE = Path(sriov_cni.__file__).parent
NETLINK_SPEAKERS = {"kernel.links", "kernel.rtnl", "kernel.vfcontrol"}
PRODUCTS = ("kernel", "plugin", "ipam", "node", "daemon")

# The areas each area may import, besides its own modules.  "shared" is the
# package top (cni, safepath, attachments, nodestate, vfstore, vfstate, log,
# paths, the version); "cli" is the sriov-cni command line.
MAY_IMPORT = {
    "kernel": set(),
    "shared": {"kernel"},
    "ipam": {"shared"},
    # sriov-ipam runs in process, as the IPAM plugin of a network.
    "plugin": {"shared", "kernel", "ipam"},
    "node": {"shared", "kernel"},
    # The daemon runs the sriov and sriov-ipam calls in its children, and
    # its metrics read the pool with status' code.
    "daemon": {"shared", "kernel", "plugin", "ipam", "node"},
    "cli": {"shared", "kernel", "node", "daemon"},
}


def _name(path: Path) -> str:
    """A module's name inside the package: ``kernel.links``, ``cni``, ``ipam`` (its __init__)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(module: str) -> set[str]:
    """Every module ``module`` imports, anywhere in it (a deferred import too), by full name."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["sriov_cni", *package[: len(package) - node.level + 1]]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                # "from sriov_cni.kernel import sysfs" imports a module; "from
                # sriov_cni.cni import CNIError" a name of one.
                inner = f"{source}.{alias.name}".removeprefix("sriov_cni.")
                found.add(f"sriov_cni.{inner}" if inner in MODULES else source)
    return found


def _ours(module: str) -> set[str]:
    """The package's modules ``module`` imports, by their names inside it (the package itself as "")."""
    return {
        name.removeprefix("sriov_cni").removeprefix(".")
        for name in _imports(module)
        if name.split(".")[0] == "sriov_cni"
    }


def _area(module: str) -> str:
    top = module.split(".")[0]
    if top in PRODUCTS or top == "cli":
        return top
    return "shared"


@pytest.mark.parametrize("area", sorted(MAY_IMPORT))
def test_each_area_imports_only_what_lies_below_it(area: str) -> None:
    members = [m for m in MODULES if _area(m) == area]
    assert members, f"no module in {area}"
    broken = sorted(
        f"{m} imports {o or 'sriov_cni'}"
        for m in members
        for o in _ours(m)
        if _area(o) != area and _area(o) not in MAY_IMPORT[area]
    )
    assert broken == []


def test_no_module_imports_itself_through_others() -> None:
    graph = {m: _ours(m) & MODULES.keys() for m in MODULES}
    cycles = []
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m == start:
                cycles.append(start)
                break
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
    assert cycles == []


def test_the_rules_see_imports_of_every_form() -> None:
    # A rule that misses a form of import would pass for nothing.
    assert "kernel.sysfs" in _ours("plugin.pool")  # from sriov_cni.kernel import sysfs
    assert "cni" in _ours("plugin.pool")  # from sriov_cni.cni import CNIError
    assert "ipam.store" in _ours("ipam.main")  # from .store import DiskStore
    assert "ipam.allocator" in _ours("ipam.main")  # from . import allocator
    assert "" in _ours("daemon.client")  # import sriov_cni
    assert "ipam.main" in _ours("daemon.server")  # import sriov_cni.ipam.main, inside a function
    assert _area("vfstore") == "shared" and _area("cli") == "cli" and _area("") == "shared"


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/support (or a helper module beside them), never in another test module."""
    tests = Path(__file__).parent
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].startswith("test_"):
                offenders.append(f"{path.relative_to(tests)}: from {node.module}")
    assert offenders == []


def test_only_sriov_cni_is_installed() -> None:
    # A top-level package of another name (ipam, as it once was) would land
    # in the users' site-packages beside everyone else's.
    repo = PACKAGE.parent
    find = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {".".join(p.parent.relative_to(repo).parts) for p in repo.rglob("__init__.py")}
    installed = {p for p in packages if any(fnmatch.fnmatchcase(p, pattern) for pattern in find["include"])}
    assert "sriov_cni.ipam" in installed
    assert {p.split(".")[0] for p in installed} == {"sriov_cni"}


def test_only_the_netlink_modules_import_pyroute2() -> None:
    importers = {m for m in MODULES if any(n.split(".")[0] == "pyroute2" for n in _imports(m))}
    assert importers == NETLINK_SPEAKERS


def test_config_allocation_store_and_tuning_do_not_load_pyroute2() -> None:
    code = (
        "import sys\n"
        "import sriov_cni.plugin.allocate, sriov_cni.plugin.config, sriov_cni.plugin.pool, sriov_cni.plugin.tuning\n"
        "import sriov_cni.vfstate, sriov_cni.vfstore\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyroute2'))\n"
        "import sriov_cni.kernel.netlink\n"
        "print('pyroute2' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split("\n")[:2] == ["[]", "True"], proc.stdout


TESTS = Path(__file__).parent
# monkeypatch.setattr calls in the tests, at most: a patched function hides
# what the product does from the test that patches it, so what can be passed
# in (a sysfs tree, a retry interval, a timeout) is passed in.  Lower it as
# patches go; never raise it.
MONKEYPATCH_SETATTR_CEILING = 27


def _setattr_calls() -> list[tuple[str, ast.Call]]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "monkeypatch"
            ):
                found.append((f"{path.relative_to(TESTS)}:{node.lineno}", node))
    return found


def test_no_test_patches_a_constant() -> None:
    """A constant a test needs otherwise (a timeout, an interval) is a parameter of the code that reads it."""
    patched = []
    for where, call in _setattr_calls():
        name = next((a.value for a in call.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)), "")
        if name.rsplit(".", 1)[-1].isupper():
            patched.append(f"{where}: {name}")
    assert patched == []


def test_monkeypatching_does_not_grow() -> None:
    calls = _setattr_calls()
    assert calls, "the scan finds no monkeypatch.setattr at all: it is broken"
    assert len(calls) <= MONKEYPATCH_SETATTR_CEILING, [where for where, _ in calls]


def test_a_test_that_runs_alike_on_two_kernels_is_one_parametrized_test() -> None:
    """Twins (test_x_72 and test_x_73) drift apart; one test with a parameter per kernel series does not."""
    twins = []
    for path in sorted(TESTS.rglob("test_*.py")):
        names = [
            n.name
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
        ]
        stems: dict[str, list[str]] = {}
        for name in names:
            stem, _, suffix = name.rpartition("_")
            if suffix.isdigit():
                stems.setdefault(stem, []).append(name)
        twins += [f"{path.relative_to(TESTS)}: {', '.join(v)}" for v in stems.values() if len(v) > 1]
    assert twins == []
