"""The commands the documents show, each run by a test (tests/docs/commands.py).

The harness: every fenced block of README.md and docs/*.md names its
language, and each command of an ``sh`` block (a line, with its backslash
continuations) is a registered Command whose test exists and takes its text
from the registry. The tests below run the commands that a host can run as
they stand, as root on the real kernel: the image build with podman, kubectl's
kustomize, install-cni and cp in a mount namespace of their own (a tmpfs over
the node directory they write, the fixture), the RDMA GID loop over a GID table
the test writes (the fixture; the machine has no RDMA device), and the VM demo,
which boots the igb guest. What needs a cluster is checked against what
kubectl would send, rendered by the pinned kubectl and validated offline.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import click
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

import sriov_cni
from sriov_cni import cli
from tests.deploy.kube import KUBERNETES, REPO, nad_notes, render, tool_path
from tests.docs import commands
from tests.docs.commands import (
    APPLY_BASE,
    APPLY_NAD,
    APPLY_POD,
    BUILD_ARCHIVE,
    CI_LINES,
    COPY_CONFLIST,
    DEMO,
    EXEC_POD,
    EXEC_STATUS,
    GID_INDEX,
    INSTALL_CNI,
    LABEL_NODE,
    REGISTRY,
    RENDER_BASE,
    ROLLOUT,
    RUN_ALL,
    Command,
)

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "shell")
# The newest Kubernetes the README claims: what a cluster today would check.
NEWEST = re.findall(r"Kubernetes 1\.\d+ to (1\.\d+)", (REPO / "README.md").read_text())


def fenced_blocks(path: Path) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block."""
    return [(m[1], m[2].splitlines()) for m in re.finditer(r"^```(\S*)\n(.*?)^```$", path.read_text(), re.M | re.S)]


def shown_commands(path: Path) -> list[str]:
    """The commands of a document's shell blocks, continuation lines joined as the shell joins them."""
    found = []
    for language, lines in fenced_blocks(path):
        if language not in SHELL:
            continue
        text = "\n".join(lines).replace("\\\n", " ")
        found += [re.sub(r"\s+", " ", line).strip() for line in text.splitlines() if line.strip()]
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_fenced_block_names_its_language(path: Path) -> None:
    # An unnamed block could hold a command the harness would not see.
    assert all(language for language, _ in fenced_blocks(path)), f"{path.name}: a fenced block without a language"


def test_every_shown_command_is_registered_and_every_registered_one_shown() -> None:
    shown = {c for path in DOCUMENTS for c in shown_commands(path)}
    registered = {c.text for c in REGISTRY}
    assert shown - registered == set(), "shown but not in tests/docs/commands.py"
    assert registered - shown == set(), "in tests/docs/commands.py but shown nowhere"
    assert len(registered) == len(REGISTRY)


def names_holding(command: Command) -> set[str]:
    """The registry's names for a command: its own, and each tuple's that holds it."""
    held = set()
    for name, value in vars(commands).items():
        if value is command or (isinstance(value, tuple) and name != "REGISTRY" and command in value):
            held.add(name)
    return held


@pytest.mark.parametrize("command", REGISTRY, ids=lambda c: c.text[:50])
def test_a_commands_test_exists_and_takes_its_text_from_the_registry(command: Command) -> None:
    path, _, function = command.test.partition("::")
    source = (REPO / path).read_text()
    [node] = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == function]
    body = ast.get_source_segment(source, node) or ""
    assert names_holding(command) & set(re.findall(r"\w+", body)), f"{command.test} does not use its command"


def run_shown(command: Command, *, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        ["bash", "-c", command.text], cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, f"{command.text}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_vm_demo_runs() -> None:
    # The first run installs what tests/setup-host.sh installs; here it is
    # there already (tests/run.sh ran it), and the demo boots the guest.
    out = run_shown(DEMO, timeout=1500)
    assert "demo finished" in out, out
    assert out.count("3 packets transmitted, 3 received") == 4, out
    assert "is back as it was" in out, out


def test_ci_runs_the_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^exec bash .*/tests/run\.sh\"?$", ci, re.M), ci
    assert RUN_ALL.text.split()[-1] == "tests/run.sh"


def test_ci_runs_the_lines_shown() -> None:
    run_sh = (REPO / "tests" / "run.sh").read_text()
    for command in CI_LINES:
        assert re.search(rf"^{re.escape(command.text)}( \|\||$)", run_sh, re.M), (
            f"not a line of tests/run.sh: {command}"
        )


def test_the_image_archive_is_built() -> None:
    archive = REPO / BUILD_ARCHIVE.text.split()[-1]
    try:
        run_shown(BUILD_ARCHIVE)
        with tarfile.open(archive) as tar:
            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        refs = [m["annotations"].get("org.opencontainers.image.ref.name", "") for m in index["manifests"]]
        assert any(ref.endswith(f"sriov-cni:{sriov_cni.__version__}") for ref in refs), refs
    finally:
        # The archive, and the sidecar build-image.sh keeps beside it.
        for written in (archive, archive.with_name(archive.name + ".id")):
            written.unlink(missing_ok=True)


def base_daemonset() -> dict[str, Any]:
    [ds] = [d for d in render(KUBERNETES / "base") if d["kind"] == "DaemonSet"]
    return ds


def test_the_node_label_is_the_daemonsets_selector() -> None:
    key, _, value = LABEL_NODE.text.split()[-1].partition("=")
    assert base_daemonset()["spec"]["template"]["spec"]["nodeSelector"] == {key: value}


def test_the_base_renders_and_is_what_apply_sends() -> None:
    out = run_shown(RENDER_BASE, env=dict(os.environ, PATH=tool_path()))
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert APPLY_BASE.text.split()[-1] == RENDER_BASE.text.split()[-1]
    assert docs == render(KUBERNETES / "base")
    for doc in docs:
        kubernetes_validate.validate(doc, f"{NEWEST[0]}.0", strict=True)


def test_the_daemonset_named_is_the_rendered_one() -> None:
    ds = base_daemonset()
    namespace, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
    assert ROLLOUT.text.split()[1:] == ["-n", namespace, "rollout", "status", f"daemonset/{name}"]
    words = EXEC_STATUS.text.split()
    assert words[1:5] == ["-n", namespace, "exec", f"ds/{name}"]
    container = words[words.index("-c") + 1]
    assert container in {c["name"] for c in ds["spec"]["template"]["spec"]["containers"]}
    program, subcommand = words[words.index("--") + 1 :]
    assert program == "sriov-cni"
    with click.Context(cli.main) as ctx:
        assert cli.main.get_command(ctx, subcommand) is not None


def example(command: Command) -> list[dict[str, Any]]:
    path = REPO / command.text.split()[-1]
    assert path.parent == KUBERNETES / "examples"
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_example_files_applied_are_valid() -> None:
    [nad] = example(APPLY_NAD)
    assert nad["kind"] == "NetworkAttachmentDefinition"
    assert nad_notes(nad) == ()
    for doc in example(APPLY_POD):
        kubernetes_validate.validate(doc, f"{NEWEST[0]}.0", strict=True)


def test_the_pod_named_is_the_example_pod() -> None:
    [pod] = example(APPLY_POD)
    [nad] = example(APPLY_NAD)
    assert EXEC_POD.text.split()[2] == pod["metadata"]["name"]
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == nad["metadata"]["name"]
    # Multus names a pod's first extra interface net1.
    assert EXEC_POD.text.split()[-1] == "net1"


def in_own_mounts(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-euc", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, **env),
        timeout=120,
    )


def test_the_podman_setup_commands_run() -> None:
    done = in_own_mounts(
        f"""mount -t tmpfs none /opt
        mount -t tmpfs none /etc/cni/net.d
        {INSTALL_CNI.text}
        {COPY_CONFLIST.text}
        echo ---
        ls /opt/cni/bin
        cmp deploy/podman/10-sriov.conflist /etc/cni/net.d/10-sriov.conflist""",
        PATH=f"{REPO / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("---")[-1].split() == ["sriov", "sriov-ipam"]


def test_the_gid_index_loop_finds_the_roce_v2_gid_of_the_address() -> None:
    # A RoCE port's GID table as the kernel lays it out: link-local GIDs,
    # then the address's, once per RoCE version (types/N says which).
    table = {
        0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
        1: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
        2: ("0000:0000:0000:0000:0000:ffff:0a38:0002", "IB/RoCE v1"),
        3: ("0000:0000:0000:0000:0000:ffff:0a38:0002", "RoCE v2"),
        4: ("0000:0000:0000:0000:0000:ffff:0a38:0003", "RoCE v2"),
    }
    port = "/sys/class/infiniband/mlx5_3/ports/1"
    writes = "\n".join(
        f'echo {gid} > {port}/gids/{n}; echo "{kind}" > {port}/gid_attrs/types/{n}' for n, (gid, kind) in table.items()
    )
    done = in_own_mounts(
        f"""mount -t tmpfs none /sys/class
        mkdir -p {port}/gids {port}/gid_attrs/types
        {writes}
        {GID_INDEX.text}""",
        dev="mlx5_3",
        ip="10.56.0.2",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3"]
