"""The types of the IPAM tests' fixtures (tests/ipam/conftest.py), for the tests' annotations."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Outcome:
    rc: int
    out: dict[str, Any] | None
    stderr: str = ""

    @property
    def code(self) -> int | None:
        return None if self.out is None else self.out.get("code")

    @property
    def msg(self) -> str:
        return "" if self.out is None else str(self.out.get("msg", ""))

    def addresses(self) -> list[str]:
        assert self.rc == 0, self.out
        assert self.out is not None
        return [ip["address"] for ip in self.out["ips"]]


class Invoke(Protocol):
    def __call__(
        self, command: str, conf: dict[str, Any], cid: str = "c1", ifname: str = "eth0", cni_args: str = ""
    ) -> Outcome: ...


Spawn = Callable[[str, dict[str, Any], str], "subprocess.Popen[bytes]"]


Wait = Callable[["subprocess.Popen[bytes]"], tuple[int, dict[str, Any] | None]]


class MakeConf(Protocol):
    def __call__(
        self, ranges: list[list[dict[str, str]]] | None = None, version: str = "1.0.0", **ipam: Any
    ) -> dict[str, Any]: ...


Stored = Callable[[], dict[str, str]]
