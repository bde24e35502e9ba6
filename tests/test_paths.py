"""The node's sysfs and procfs roots are named once, in ``sriov_cni.paths``, and passed down.

A root written anywhere else (a module global, a literal in a function) is
one a test cannot point at its tree without patching the module, and one
that code given another root (``sriov-cni daemon --proc-irq``) would still
read behind its back.  The process's own files (``/proc/self``, its cgroup)
are not the node's and may be named where they are used.
"""

from __future__ import annotations

import ast
from pathlib import Path

import sriov_cni
from sriov_cni.paths import Paths

PACKAGE = Path(sriov_cni.__file__).parent
# Where the node's devices, CPUs and IRQs are; the process's own corners of
# /proc and /sys (self, thread-self, <pid>, fs/cgroup) are not among them.
NODE_ROOTS = ("/sys/bus", "/sys/class", "/sys/devices", "/proc/irq", "/proc/sys/net/core")


def _names_a_node_root(text: str) -> bool:
    return text in ("/sys", "/proc") or any(text == root or text.startswith(root + "/") for root in NODE_ROOTS)


def node_root_literals() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "paths.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and _names_a_node_root(node.value)
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_the_node_roots_are_named_only_in_paths() -> None:
    assert node_root_literals() == []


def test_the_scan_sees_a_root_written_elsewhere() -> None:
    # The rule above cannot pass by seeing nothing: each form of a root it
    # must catch is caught, and the process's own files are let through.
    for text, caught in [
        ("/sys", True),
        ("/proc/irq", True),
        ("/sys/bus/pci/devices", True),
        ("/sys/class/net", True),
        ("/proc/sys/net/core/rps_sock_flow_entries", True),
        ("/proc/self/fd", False),
        ("/proc/thread-self/ns/net", False),
        ("/sys/fs/cgroup", False),
    ]:
        assert _names_a_node_root(text) is caught, text


def test_the_default_paths_are_the_hosts() -> None:
    assert (Paths().sys, Paths().proc, Paths().proc_irq) == (Path("/sys"), Path("/proc"), Path("/proc/irq"))
