"""What a measuring daemon's children record of each call, and that the store is left as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sriov_cni.daemon import measure
from sriov_cni.vfstore import FileStore

PCI_A = "0000:3b:10.0"
PCI_B = "0000:3b:10.1"


def test_every_claim_records_its_wait_and_whether_it_got_the_claim(tmp_path: Path) -> None:
    claims = measure.ClaimTimes()
    # The store a daemon child's call opens (programs.Host.store): a real FileStore, timed.
    files = claims.store(str(tmp_path))
    # Held by another process, as another call holds a VF.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom sriov_cni.vfstore import FileStore\n"
            "claim = FileStore(sys.argv[1]).claim(sys.argv[2])\nprint(claim is not None, flush=True)\nsys.stdin.read()",
            str(tmp_path),
            PCI_B,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "True\n"
    try:
        first = files.claim(PCI_A)
        assert first is not None
        assert files.claim(PCI_B) is None
        assert files.claim(PCI_B, wait=0.05) is None
        first.drop()
    finally:
        holder.communicate("", timeout=60)
    assert [got for _, got in claims.times] == [True, False, False]
    assert claims.refused() == 2
    # The one told to wait for the holder waited that long.
    assert claims.times[2][0] >= 0.05
    # A store opened elsewhere, as by the plugin run in process, is not timed.
    assert FileStore(tmp_path).claim(PCI_A) is not None
    assert len(claims.times) == 3
