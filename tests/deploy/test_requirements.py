"""The image's pinned Python packages (deploy/image/*requirements.txt) against
pyproject.toml: every dependency pinned to a release it allows, with hashes,
so that `pip install --require-hashes` in the Containerfile accepts them.
Files only; tests/deploy/test_image.py checks the built image."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.deploy.requirements import BUILD_REQUIREMENTS, REQUIREMENTS, canonical, pinned

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def declared() -> dict[str, list[Requirement]]:
    with PYPROJECT.open("rb") as f:
        p = tomllib.load(f)
    return {
        REQUIREMENTS.name: [Requirement(r) for r in p["project"]["dependencies"]],
        BUILD_REQUIREMENTS.name: [Requirement(r) for r in p["build-system"]["requires"]],
    }


@pytest.mark.parametrize("path", [REQUIREMENTS, BUILD_REQUIREMENTS], ids=lambda p: p.name)
def test_every_declared_dependency_is_pinned_to_a_release_pyproject_allows(path: Path) -> None:
    pins = {canonical(name): version for name, version in pinned(path)}
    for req in declared()[path.name]:
        name = canonical(req.name)
        assert name in pins, f"{path.name} does not pin {req} (run deploy/image/lock-requirements.sh)"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{path.name} pins {name}=={pins[name]}, outside {req} (run deploy/image/lock-requirements.sh)"
        )
