"""The daemon against callers that do not follow the protocol, and a broken install.

Each test runs the real daemon and sends it, over its socket, what a
hostile or broken caller could: frames cut short, lengths out of range, a
wrong version, missing or wrong descriptors, odd environment entries,
callers that send nothing, a thousand at once, callers that leave before
the answer.  Each is answered with a refusal (a CNI error object, nothing
run) or has its connection dropped; the daemon keeps serving honest calls,
and holds no more descriptors, children or memory than before.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from daemonlib import Daemon, shim

VERSION_CONF = b'{"cniVersion": "1.0.0"}'


def test_children_that_end_at_start_are_forked_again_only_after_a_while(tmp_path: Path) -> None:
    # A node where every child fails as it starts: /dev/null, which each
    # opens first, is a read-only file in the daemon's mount namespace.
    null = tmp_path / "null"
    null.write_bytes(b"")
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind -o ro "$0" /dev/null && exec "$@"', str(null)]
    d = Daemon(tmp_path / "run", wrapper=wrapper)
    assert d.proc.stderr is not None
    try:
        lines = [d.proc.stderr.readline() for _ in range(4)]
        # Logged once each, every fork after a doubled interval: not a
        # fork loop.
        for line in lines:
            assert "a child ended before it could take calls (exit status 1" in line, lines
        found = [re.search(r"the next fork in ([0-9.]+) s", line) for line in lines]
        assert [float(m.group(1)) for m in found if m] == [0.5, 1.0, 2.0, 4.0], lines
        # Meanwhile a call is told why, and that nothing ran.
        rc, out = shim(d.socket, "VERSION", VERSION_CONF)
        assert rc == 1 and out["code"] == 11, out
        assert "children end before they can take calls (exit status 1" in out["msg"]
        # Repaired, the daemon serves again after its current interval.
        subprocess.run(["nsenter", "--mount", "--target", str(d.proc.pid), "umount", "/dev/null"], check=True)
        rc, out = 1, {}
        while rc:
            rc, out = shim(d.socket, "VERSION", VERSION_CONF)
            assert rc == 0 or out["code"] == 11, out
        assert out["cniVersion"] == "1.0.0"
    finally:
        d.stop()
