#!/usr/bin/env python3
"""Stands in for QEMU in the rig's host tests (test_rig.py): plays the guest's init.

Usage: ``fakeguest.py RESULTS``.  Prints the last lines a booting guest prints
before init starts the command, then runs ``RESULTS/run.sh`` as init does:
its output goes to the console and to ``RESULTS/output``, its exit status to
``RESULTS/status``.  The command dies when this process does, as a guest's
command dies with QEMU when the rig kills it.

Until the command creates ``RESULTS/silent`` the console says a line every
half second, as a guest's kernel and init would: a test of the rig's quiet
limit is then silent only from the moment it chooses, not while a loaded
machine starts pytest.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Console:
    """The console's writes, a heartbeat's only between whole lines."""

    def __init__(self) -> None:
        self.out = sys.stdout.buffer
        self.lock = threading.Lock()
        self.at_line_start = True

    def write(self, chunk: bytes) -> None:
        with self.lock:
            self.out.write(chunk)
            self.out.flush()
            self.at_line_start = chunk.endswith(b"\n")

    def heartbeat(self, silent: Path, done: threading.Event) -> None:
        while not done.wait(0.5) and not silent.exists():
            with self.lock:
                if self.at_line_start:
                    self.out.write(b"fakeguest: console alive\n")
                    self.out.flush()


def main() -> int:
    results = Path(sys.argv[1])
    console = Console()
    silent = results / "silent"
    silent.unlink(missing_ok=True)
    done = threading.Event()
    threading.Thread(target=console.heartbeat, args=(silent, done), daemon=True).start()
    out = console
    # SeaBIOS ends its last line without a newline; init's line follows it.
    out.write(b"SeaBIOS (version fake)\r\nBooting from ROM...vm-init: running command\n")
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
            output.write(chunk)
            output.flush()
        status = command.wait()
    done.set()
    (results / "status").write_text(f"{status}\n")
    out.write(f"vm-init: command exited with status {status}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
