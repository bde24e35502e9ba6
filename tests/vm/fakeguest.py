#!/usr/bin/env python3
"""Stands in for QEMU in the rig's host tests (test_rig.py): plays the guest's init.

Usage: ``fakeguest.py RESULTS``.  Prints the last lines a booting guest prints
before init starts the command, then runs ``RESULTS/run.sh`` as init does:
its output goes to the console and to ``RESULTS/output``, its exit status to
``RESULTS/status``.  The command dies when this process does, as a guest's
command dies with QEMU when the rig kills it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> int:
    results = Path(sys.argv[1])
    out = sys.stdout.buffer
    # SeaBIOS ends its last line without a newline; init's line follows it.
    out.write(b"SeaBIOS (version fake)\r\nBooting from ROM...vm-init: running command\n")
    out.flush()
    with (results / "output").open("wb") as output:
        command = subprocess.Popen(
            ["sh", str(results / "run.sh")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        assert command.stdout is not None
        fd = command.stdout.fileno()
        # As it comes, like tee: a line pytest has begun but not ended is in the output too.
        for chunk in iter(lambda: os.read(fd, 65536), b""):
            out.write(chunk)
            out.flush()
            output.write(chunk)
            output.flush()
        status = command.wait()
    (results / "status").write_text(f"{status}\n")
    out.write(f"vm-init: command exited with status {status}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
