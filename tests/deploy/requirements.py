"""deploy/image/requirements.txt and build-requirements.txt as pip reads them:
one pin (name==version) per entry, each with its --hash options."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name

IMAGE_DIR = Path(__file__).resolve().parents[2] / "deploy" / "image"
REQUIREMENTS = IMAGE_DIR / "requirements.txt"
BUILD_REQUIREMENTS = IMAGE_DIR / "build-requirements.txt"


def entries(path: Path) -> list[str]:
    """Each requirement with its continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def pinned(path: Path) -> list[tuple[str, str]]:
    """(name, version) of every entry, which must be an exact pin."""
    pins = []
    for entry in entries(path):
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s]+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", entry)
        assert m, f"{path.name}: not a hashed pin: {entry}"
        pins.append((m[1], m[2]))
    return pins


def canonical(name: str) -> str:
    return canonicalize_name(name)


def canonical_pin(line: str) -> tuple[str, str]:
    name, _, version = line.partition("==")
    return canonical(name), version
