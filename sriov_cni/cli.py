"""The node command ``sriov-cni``: ``setup`` creates and tunes VFs, ``status`` shows them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from sriov_cni import __version__, nodestate
from sriov_cni import vfstore as store
from sriov_cni.cni import CNIError
from sriov_cni.daemon import budget, client, install, probe
from sriov_cni.daemon import options as daemon_options
from sriov_cni.paths import Paths

# A command imports what loads pyroute2, prometheus_client or yaml (the
# node's and the daemon's modules) only when it runs: the kubelet runs
# `sriov-cni ready` every 20 s, and loading them would be most of its CPU.

SETUP_HELP = """Create VFs and tune IRQs/RPS/XPS/RFS as the node config FILE says.

\b
Per PF, in order: sriov_numvfs (through 0 when the count changes; refused
while the CNI plugin's store holds allocations on that PF), VF driver,
MTU (raised, never lowered), link up, queue IRQ pins and queue maps.
Everything already as asked is left alone, so running it again is safe.
Each step's outcome goes to stdout; before a step that can take seconds
(sriov_numvfs takes up to two minutes per PF on mlx5, VF rebinds, waiting
on irqbalance) one line on stderr says what setup is waiting for.
What was applied goes to the state file, which `status` and the CNI plugin
read: the plugin pins each VF's IRQs and sets RPS/XPS in the pod after it
brings the VF up there.

\b
irqbalance moves pinned IRQs back every 10 s. The node config's
irqbalance key says what setup does about it, before it pins anything:
  ban (default)  write a policy script next to the state file that bans
                 every IRQ of the tuned PFs and their VFs, and make an
                 irqbalance that runs it rescan; irqbalance must be started
                 with --policyscript=<that script> (setup warns otherwise)
  stop           stop irqbalance (systemctl disable --now under systemd,
                 SIGTERM otherwise)
  leave          pin anyway and print what to do

\b
rdmaNetnsMode (exclusive or shared) writes the ib_core boot option to
<modprobe.d>/sriov-cni-rdma.conf (exclusive: netns_mode=0; shared: the file
removed) and switches the running kernel, which it allows only while no
network namespace but the host's exists. When it does not, setup says so,
the mode applies at the next boot, and setup exits with status 3: the
node is not yet as asked.
"""

# setup's exit status when every step ran but the node is not yet as asked
# (the RDMA netns mode waits for the next boot).
DEFERRED = 3


class CommandError(click.ClickException):
    """One line on stderr and exit status 1, never a traceback."""


def _expected() -> tuple[type[Exception], ...]:
    """The errors setup and status report in one line."""
    from sriov_cni.kernel import netlink, sysfs
    from sriov_cni.node import config as node_config
    from sriov_cni.node import setup as node_setup

    return (
        node_config.NodeConfigError,
        node_setup.SetupError,
        nodestate.TuningError,
        sysfs.SysfsError,
        netlink.NetlinkError,
        CNIError,
    )


# -h as well as --help, on every command: each carries it, since click
# keeps a command's help option from its first context.
_CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(context_settings=_CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="sriov-cni", message="%(prog)s %(version)s")
def main() -> None:
    """Node-side SR-IOV: create VFs, pin their IRQs, show who uses them."""


def _node_paths() -> Paths:
    """The node's paths; a caller of :func:`main` may pass others as its context object (a test, a tree)."""
    given = click.get_current_context().find_object(Paths)
    return Paths() if given is None else given


@main.command(help=SETUP_HELP, context_settings=_CONTEXT)
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Node config (YAML).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option(
    "--data-dir",
    default=store.DEFAULT_DATA_DIR,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The CNI plugin's store.",
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Where to record what was applied [default: {nodestate.STATE_FILE}].",
)
@click.option(
    "--modprobe-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Where to write the ib_core option for rdmaNetnsMode [default: {Paths.modprobe_dir}].",
)
@click.option(
    "--allow-deferred",
    is_flag=True,
    help="Exit 0, not 3, when what is not yet as asked waits for the next boot (an init container must, "
    "or the daemon it comes before never starts).",
)
def setup(
    config_path: Path,
    dry_run: bool,
    data_dir: Path,
    state_file: Path | None,
    modprobe_dir: Path | None,
    allow_deferred: bool,
) -> None:
    from sriov_cni.node import config as node_config
    from sriov_cni.node import setup as node_setup

    try:
        config = node_config.load(config_path)
        paths = _node_paths() if state_file is None else replace(_node_paths(), state_file=state_file)
        paths = paths if modprobe_dir is None else replace(paths, modprobe_dir=modprobe_dir)
        plan = node_setup.plan(config, paths, data_dir, node_setup.NetlinkLinks())
        if dry_run:
            node_setup.show(plan, paths, click.echo)
            return
        # Before a step that can take seconds (sriov_numvfs on mlx5 takes up
        # to two minutes), one line on stderr, so the run does not look hung.
        as_asked = node_setup.execute(plan, paths, click.echo, lambda line: click.echo(f"setup: {line}", err=True))
    except _expected() as exc:
        raise CommandError(str(exc)) from exc
    if not as_asked and not allow_deferred:
        raise SystemExit(DEFERRED)


@main.command(context_settings=_CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--data-dir",
    default=store.DEFAULT_DATA_DIR,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The CNI plugin's store.",
)
def status(as_json: bool, data_dir: Path) -> None:
    """Every SR-IOV PF and VF: driver, counts, link, owners, stale allocations, IRQ pins, irqbalance, RDMA."""
    from sriov_cni.node import status as node_status

    view = node_status.rdma_view()
    try:
        pfs = node_status.current(_node_paths(), data_dir, view)
    except _expected() as exc:
        raise CommandError(str(exc)) from exc
    # None: the kernel has no RDMA core loaded.
    rdma_mode = view.mode
    if as_json:
        click.echo(json.dumps({"rdmaNetnsMode": rdma_mode, "pfs": pfs}, indent=1))
    else:
        for line in node_status.table(pfs, rdma_mode):
            click.echo(line)
    # Shown with the rest of the pool, and still a failure: someone must look.
    damaged = [vf["pci"] for pf in pfs for vf in pf["vfs"] if vf["recordError"]]
    if damaged:
        raise CommandError(f"unreadable records of VF {', '.join(damaged)} in {data_dir}: see their state above")


@main.command(context_settings=_CONTEXT)
@click.option(
    "--socket",
    "socket_path",
    default=client.DEFAULT_SOCKET,
    show_default=True,
    help="Where to listen; its directory is made root-only (0700) when it holds nothing else, "
    "and refused when others may write it.",
)
@click.option(
    "--request-timeout",
    default=daemon_options.REQUEST_TIMEOUT,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a caller has to send its request, and then to end its stdin.",
)
@click.option(
    "--max-children",
    default=daemon_options.MAX_CHILDREN,
    show_default=True,
    type=click.IntRange(min=1),
    help="Calls run at once at most, however large the memory budget; more wait their turn.",
)
@click.option(
    "--child-idle",
    default=daemon_options.CHILD_IDLE,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a child that has served calls waits for another before it ends.",
)
@click.option(
    "--calls-per-child",
    default=daemon_options.CALLS_PER_CHILD,
    show_default=True,
    type=click.IntRange(min=1),
    help="Calls a child serves, one after another, before it ends; 1: a fresh child for each call.",
)
@click.option(
    "--memory-budget",
    metavar="SIZE",
    help="Memory the daemon and its calls may use (e.g. 160Mi); default: its cgroup's limit. "
    "Calls run at once are as many as fit, at most --max-children.",
)
@click.option(
    "--drain-timeout",
    default=daemon_options.DRAIN_TIMEOUT,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds after SIGTERM that the calls running may take to end; new ones are refused.",
)
@click.option(
    "--proc-irq",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The host's /proc/irq mounted here, where the calls pin VF IRQs "
    "(a container that is not privileged has /proc/irq read-only).",
)
@click.option(
    "--metrics-address",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics of the calls and the VF pool at http://HOST:PORT/metrics "
    "(e.g. 127.0.0.1:9731); default: not served. Any host that can reach HOST can read them.",
)
@click.option(
    "--data-dir",
    default=store.DEFAULT_DATA_DIR,
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The CNI plugin's store (the networks' default dataDir): the metrics' pool, the NRI plugin's RDMA pods, "
    "and the VFs of dead pods the daemon gives back.",
)
@click.option(
    "--nri-socket",
    default=daemon_options.NRI_SOCKET,
    show_default=True,
    help="The runtime's NRI socket: whenever it exists, the daemon registers there as an NRI plugin "
    "that gives the containers of pods with an RDMA device its /dev/infiniband devices and the "
    "network's rdmaMemlock limit.",
)
@click.option("--no-nri", is_flag=True, help="Do not run the NRI plugin.")
@click.option(
    "--no-heal",
    is_flag=True,
    help="Do not give back the VFs of pods that died without a DEL (from --data-dir's store); "
    "they wait for an ADD that finds no free VF, or for CNI GC.",
)
def daemon(
    socket_path: str,
    request_timeout: float,
    max_children: int,
    child_idle: float,
    calls_per_child: int,
    memory_budget: str | None,
    drain_timeout: float,
    proc_irq: Path | None,
    metrics_address: str | None,
    data_dir: Path,
    nri_socket: str,
    no_nri: bool,
    no_heal: bool,
) -> None:
    """Run the daemon that serves the sriov and sriov-ipam CNI executables (root only, until SIGTERM).

    On SIGTERM it refuses new calls (CNI code 11, try again later), lets the
    running ones end, and exits 0; 1 when some still ran after --drain-timeout.
    """
    from sriov_cni.daemon import exporter, server
    from sriov_cni.daemon.measure import Measure

    try:
        size = None if memory_budget is None else budget.parse_size(memory_budget)
    except budget.BudgetError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-budget") from exc
    try:
        address = None if metrics_address is None else exporter.parse_address(metrics_address)
    except exporter.MetricsError as exc:
        raise click.BadParameter(str(exc), param_hint="--metrics-address") from exc
    options = daemon_options.Options(
        socket=socket_path,
        request_timeout=request_timeout,
        max_children=max_children,
        child_idle=child_idle,
        calls_per_child=calls_per_child,
        memory_budget=size,
        drain_timeout=drain_timeout,
        metrics_address=address,
        data_dir=data_dir,
        paths=_node_paths() if proc_irq is None else replace(_node_paths(), proc_irq=proc_irq),
        measure=Measure.from_env(),
        nri_socket=None if no_nri else nri_socket,
        heal=not no_heal,
    )
    try:
        running = server.serve(options)
    except exporter.MetricsError as exc:
        raise CommandError(f"cannot serve metrics: {exc}") from exc
    except (CNIError, OSError) as exc:
        raise CommandError(f"cannot listen on {socket_path}: {exc}") from exc
    if running:
        raise CommandError(f"stopped {drain_timeout:g} s after SIGTERM with {running} calls still running")
    click.echo("sriov-cni daemon: stopped, no call running", err=True)


@main.command(context_settings=_CONTEXT)
@click.option("--socket", "socket_path", default=client.DEFAULT_SOCKET, show_default=True, help="The daemon's socket.")
@click.option(
    "--timeout",
    default=probe.TIMEOUT,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds the call may take.",
)
def ready(socket_path: str, timeout: float) -> None:
    """Exit 0 only when the daemon runs a call (a CNI VERSION) and answers: a readiness probe."""
    problem = probe.probe(socket_path, timeout)
    if problem is not None:
        raise CommandError(f"not ready: {problem}")
    click.echo(f"ready: the daemon at {socket_path} ran a call and answered")


INSTALL_CNI_HELP = """Write the sriov and sriov-ipam CNI executables: the static shim, which needs only the daemon.

\b
DEST must exist: a misspelt path is refused and nothing is created, unless
--create-dest is given. A file already there that sriov-cni did not write
(the reference Go plugin's sriov, for one) is replaced, with one line on
stderr naming it, and kept beside it as <name>.orig (an older .orig is
overwritten); move it back to undo. Our own earlier executables are
replaced silently.
"""


@main.command("install-cni", context_settings=_CONTEXT, help=INSTALL_CNI_HELP)
@click.option("--dest", default="/opt/cni/bin", show_default=True, help="The runtime's CNI plugin directory.")
@click.option(
    "--create-dest",
    is_flag=True,
    help="Create DEST (and missing parents, mode 0755) when it does not exist, instead of refusing.",
)
@click.option(
    "--python",
    "python",
    help="Write Python scripts run by this interpreter (a path valid where they run) instead of the shim.",
)
def install_cni(dest: str, create_dest: bool, python: str | None) -> None:
    def replacing(old: install.Replaced) -> None:
        click.echo(f"install-cni: replacing {old.path} ({old.what}); the old file is kept as {old.backup}", err=True)

    try:
        for path in install.install(dest, python, create_dest=create_dest, on_replace=replacing):
            click.echo(f"wrote {path}")
    except install.MissingDestination as exc:
        raise CommandError(f"{exc}: check the path, or pass --create-dest to create it") from exc
    except (install.ShimNotBuilt, CNIError) as exc:
        raise CommandError(str(exc)) from exc
    except OSError as exc:
        raise CommandError(f"cannot write into {dest}: {exc.strerror}") from exc
