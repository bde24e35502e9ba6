"""Every shell command README.md and docs/*.md show in a fenced ``sh`` block,
each with the test that runs it. tests/docs/test_commands.py fails on a shown
command missing here and on an entry no document shows any more; a test that
runs a command takes its text from here, so the two cannot drift.

``test`` names the test as ``path::function``. ``runs`` says what that test
does with the text: as shown, or, where the command needs what a test machine
does not have (a cluster), what stands in for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    text: str
    test: str
    runs: str


DOCS = "tests/docs/test_commands.py"
CLUSTER = "needs a cluster; the test renders or reads what it would send, validates it against the API schemas"

DEMO = Command(
    "sudo deploy/demo/demo.sh",
    f"{DOCS}::test_the_vm_demo_runs",
    "as shown, on the host: it sets the machine up and boots the igb guest",
)
DEMO_NODE = Command(
    "sudo deploy/demo/demo-node.sh --pf ens1f0",
    "tests/vm/test_demo_node_igb.py::test_the_readmes_demo_node_runs_and_leaves_the_node_as_found",
    "as shown, as root in the igb guest, whose igb PF is renamed ens1f0 to stand in for a real NIC",
)
RUN_ALL = Command(
    "sudo tests/run.sh",
    f"{DOCS}::test_ci_runs_the_test_command",
    "by CI on every change: .ci/run runs tests/run.sh; the test checks that it does",
)
BUILD_ARCHIVE = Command(
    "deploy/image/build-image.sh --offline --oci-archive sriov-cni.tar",
    f"{DOCS}::test_the_image_archive_is_built",
    "as shown, from the checkout; the archive is read back and removed",
)
LABEL_NODE = Command(
    "kubectl label node NODE feature.node.kubernetes.io/network-sriov.capable=true",
    f"{DOCS}::test_the_node_label_is_the_daemonsets_selector",
    f"{CLUSTER}: the label is the one the rendered DaemonSet selects nodes by",
)
RENDER_BASE = Command(
    "kubectl kustomize deploy/kubernetes/base",
    f"{DOCS}::test_the_base_renders_and_is_what_apply_sends",
    "as shown, with the pinned kubectl (tests/deploy/tools.txt); its output is validated",
)
APPLY_BASE = Command(
    "kubectl apply -k deploy/kubernetes/base",
    f"{DOCS}::test_the_base_renders_and_is_what_apply_sends",
    f"{CLUSTER}: apply -k sends what kubectl kustomize renders",
)
ROLLOUT = Command(
    "kubectl -n kube-system rollout status daemonset/sriov-cni",
    f"{DOCS}::test_the_daemonset_named_is_the_rendered_one",
    f"{CLUSTER}: the DaemonSet named is the rendered one",
)
APPLY_NAD = Command(
    "kubectl apply -f deploy/kubernetes/examples/nad-self-allocating.yaml",
    f"{DOCS}::test_the_example_files_applied_are_valid",
    f"{CLUSTER}; the NAD's config is parsed as the daemon parses it",
)
APPLY_POD = Command(
    "kubectl apply -f deploy/kubernetes/examples/pod.yaml",
    f"{DOCS}::test_the_example_files_applied_are_valid",
    CLUSTER,
)
EXEC_POD = Command(
    "kubectl exec sriov-demo -- ip addr show net1",
    f"{DOCS}::test_the_pod_named_is_the_example_pod",
    f"{CLUSTER}: the pod named is the example Pod, on the example network",
)
EXEC_STATUS = Command(
    "kubectl -n kube-system exec ds/sriov-cni -c daemon -- sriov-cni status",
    f"{DOCS}::test_the_daemonset_named_is_the_rendered_one",
    f"{CLUSTER}: the DaemonSet and its container daemon are the rendered ones; the image's sriov-cni runs in"
    " tests/deploy/test_image.py",
)
INSTALL_CNI = Command(
    "sriov-cni install-cni --dest /opt/cni/bin --create-dest",
    f"{DOCS}::test_the_podman_setup_commands_run",
    "as shown, as root, in a mount namespace of its own whose /opt is an empty tmpfs",
)
COPY_CONFLIST = Command(
    "cp deploy/podman/10-sriov.conflist /etc/cni/net.d/",
    f"{DOCS}::test_the_podman_setup_commands_run",
    "as shown, as root, in a mount namespace of its own whose /etc/cni/net.d is an empty tmpfs",
)
GID_INDEX = Command(
    'cd /sys/class/infiniband/$dev/ports/1 && for g in $(grep -lx "0000:0000:0000:0000:0000:ffff:$(printf'
    ' %02x%02x:%02x%02x $(echo $ip | tr . \' \'))" gids/* 2>/dev/null); do grep -qx "RoCE v2"'
    " gid_attrs/types/${g#gids/} 2>/dev/null && echo ${g#gids/}; done",
    f"{DOCS}::test_the_gid_index_loop_finds_the_roce_v2_gid_of_the_address",
    "as shown, in a mount namespace of its own whose /sys/class/infiniband is a GID table written by the test;"
    " tests/vm/test_nri_rdma.py runs it too, on a Soft-RoCE device's real table on Linux 7.3",
)
RUN_SH = "by CI: a line of tests/run.sh, which .ci/run runs on every change; the test checks the line is there"
TYPECHECK = Command("bash tests/typecheck.sh", f"{DOCS}::test_ci_runs_the_lines_shown", RUN_SH)
FORMAT_CHECK = Command("python3 -m ruff format --check --quiet .", f"{DOCS}::test_ci_runs_the_lines_shown", RUN_SH)
LINT = Command("python3 -m ruff check --quiet .", f"{DOCS}::test_ci_runs_the_lines_shown", RUN_SH)
HOST_TESTS = Command('python3 -m pytest -ra -m "not sriov_vm"', f"{DOCS}::test_ci_runs_the_lines_shown", RUN_SH)
GUEST_TESTS = Command(
    "python3 tests/vm/rig.py --timeout 3600 -- python3 -m pytest -ra -v -m sriov_vm tests/vm tests/stress",
    f"{DOCS}::test_ci_runs_the_lines_shown",
    RUN_SH,
)
CI_LINES = (TYPECHECK, FORMAT_CHECK, LINT, HOST_TESTS, GUEST_TESTS)

REGISTRY = (
    DEMO,
    DEMO_NODE,
    RUN_ALL,
    BUILD_ARCHIVE,
    LABEL_NODE,
    RENDER_BASE,
    APPLY_BASE,
    ROLLOUT,
    APPLY_NAD,
    APPLY_POD,
    EXEC_POD,
    EXEC_STATUS,
    INSTALL_CNI,
    COPY_CONFLIST,
    GID_INDEX,
    *CI_LINES,
)
