"""The thread that ends a call's child when its caller goes away."""

from __future__ import annotations

import os
import select
import signal
import socket
import threading


class Watchdog:
    """Ends this child when its caller hangs up before the answer.

    A runtime that gives up on a call kills the executable it ran, the shim.
    The call's child must end with it, as an executed plugin would, and so
    must what it started: a call (or its delegated IPAM) that finished later
    would race the runtime's next call for the same pod (a DEL whose IPAM
    wakes up after a re-ADD releases the live pod's address).  The records
    make a call killed at any point safe to repeat.

    The thread starts before a call arrives (:func:`childpool.spare`), so a call does
    not wait for it.
    """

    def __init__(self) -> None:
        self.answered = threading.Event()
        self._conn: socket.socket | None = None
        self._given = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def watch(self, conn: socket.socket) -> None:
        self._conn = conn
        self._given.set()

    def _run(self) -> None:
        self._given.wait()
        assert self._conn is not None
        poller = select.poll()
        try:
            poller.register(self._conn.fileno(), select.POLLRDHUP)
        except ValueError:
            # Closed already (fileno -1): the call ended, its caller killed
            # or answered, before this thread began to watch.  Raising here
            # would print a traceback into the caller's stderr.
            return
        poller.poll()
        if not self.answered.is_set():
            os.killpg(0, signal.SIGKILL)
