"""TEST FIXTURE: containerd 2.x (Debian sid's, pinned) for the guest, where NRI is on by default.

Bookworm's containerd 1.6 has no NRI v2 (its plugins cannot adjust a
container), so tests/vm/test_nri_rdma.py runs sid's instead, with
bookworm's runc (sid's containerd 2.1.9 runs with runc 1.1.5).  The
package is fetched once through the rig's own apt list of sid and
experimental (tests/vm/rig.py; the machine's apt sources are never
touched) and unpacked into the rig's cache.  Fetch it on the host before
booting the guest, which sees the host's root and finds it there::

    python3 -m tests.vm.containerd2
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.vm import rig

PACKAGE = "containerd"
# sid's; a pin the archive has dropped fails the download naming it: move
# it to what sid has now.
VERSION = "2.1.9+ds1-5"


def unpacked() -> Path:
    """Where the pinned package is unpacked (its usr/bin/containerd), whether or not it is there yet."""
    return rig.cache_dir() / f"{PACKAGE}_{VERSION}"


def binary() -> Path:
    return unpacked() / "usr" / "bin" / "containerd"


def fetch() -> Path:
    """The pinned containerd's binary, downloaded and unpacked unless it is already."""
    if binary().exists():
        return binary()
    cache = rig.cache_dir()
    options = rig._newer_apt(cache)
    lists = cache / "apt-newer" / "lists"
    if not any(lists.glob("*_Packages*")):
        rig._run(["apt-get", *options, "update", "-q"], "reading sid's package lists")
    deb = rig._fetch(PACKAGE, cache / "debs", VERSION, options)
    rig._unpack([deb], unpacked())
    return binary()


if __name__ == "__main__":
    try:
        print(fetch())
    except rig.RigError as exc:
        sys.exit(f"containerd2: {exc} (pin: VERSION in tests/vm/containerd2.py)")
