"""CNI entry points of the IPAM: a handler per command.

The ``sriov`` plugin calls ``HANDLERS[command](args)`` in-process with the
CmdArgs it received; the ``sriov-ipam`` executable runs the same table
through ``sriov_cni.cni.dispatch``.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import sys
from typing import Any

from sriov_cni import log
from sriov_cni.attachments import valid_attachments
from sriov_cni.cni import CmdArgs, Handler, IPConfig, Result, dispatch, io_error, read_config

from . import allocator, config
from .store import DiskStore, Owner

# The executable's name, in its log lines.
PROGRAM = "sriov-ipam"
ABOUT = "sriov-ipam: host-local-compatible IP address management for SR-IOV networks"


def _owner(args: CmdArgs) -> Owner:
    return Owner(args.container_id, args.ifname)


def _store(conf: Any) -> DiskStore:
    data_dir, network = config.store_location(conf)
    return DiskStore(data_dir, network)


def cmd_add(args: CmdArgs) -> Result:
    cfg = config.load(args.conf)
    requested = config.requested_ips(args, cfg)
    reservations = allocator.allocate(_store(args.conf), cfg, _owner(args), requested)
    # The abbreviated IPAM result: the calling plugin adds interfaces and
    # the ips[].interface index.
    return Result(
        ips=[
            IPConfig(
                address=ipaddress.ip_interface(f"{a.ip}/{a.range.subnet.prefixlen}"),
                gateway=a.range.gateway,
            )
            for a in reservations
        ],
        routes=list(cfg.routes),
        dns=cfg.dns,
    )


def cmd_del(args: CmdArgs) -> None:
    allocator.release(_store(args.conf), _owner(args))


def cmd_check(args: CmdArgs) -> None:
    cfg = config.load(args.conf)
    allocator.check(_store(args.conf), cfg, _owner(args))


def cmd_gc(args: CmdArgs) -> None:
    valid = {Owner(container_id, ifname) for container_id, ifname in valid_attachments(args.conf)}
    allocator.collect(_store(args.conf), valid)


def cmd_status(args: CmdArgs) -> None:
    allocator.status(_store(args.conf), config.load(args.conf))


def _reporting_io_errors(handler: Handler) -> Handler:
    """Turn an OSError into the CNI I/O error naming the path, not a traceback."""

    @functools.wraps(handler)
    def wrapper(args: CmdArgs) -> Result | None:
        try:
            return handler(args)
        except OSError as exc:
            raise io_error(exc, str(exc.filename) if exc.filename else "") from exc

    return wrapper


HANDLERS: dict[str, Handler] = {
    name: _reporting_io_errors(handler)
    for name, handler in (
        ("ADD", cmd_add),
        ("DEL", cmd_del),
        ("CHECK", cmd_check),
        ("GC", cmd_gc),
        ("STATUS", cmd_status),
    )
}


def main() -> None:
    log.configure_from_env(PROGRAM, os.environ)
    sys.exit(dispatch(HANDLERS, os.environ, read_config(sys.stdin.buffer), sys.stdout, sys.stderr, ABOUT))
