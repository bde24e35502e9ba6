"""Fixtures of the daemon's tests: the built shim, a daemon on a temporary socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemonlib import SHIM, Daemon


@pytest.fixture(autouse=True)
def shim_built() -> None:
    if not SHIM.exists():
        pytest.fail("the shim is not built: make -C shim (tests/setup-host.sh does it)", pytrace=False)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "run")
    yield d
    d.stop()
