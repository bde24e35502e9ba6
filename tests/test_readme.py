"""The README's table of contents lists every section, in order, with links GitHub resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_the_contents_list_every_section_in_order() -> None:
    text = README.read_text()
    _, _, body = text.partition("## Contents\n")
    assert body, "README.md has no contents"
    listed = re.findall(r"^( *)- \[(.+)\]\(#(.+)\)$", body.split("\n## ", 1)[0], re.M)
    headings = [(m[1], m[2]) for m in re.finditer(r"^(##+) (.+)$", body, re.M)]
    assert [(len(indent) // 2 + 2, title, link) for indent, title, link in listed] == [
        (len(level), title, anchor(title)) for level, title in headings
    ]


DOCS = sorted((README.parent / "docs").glob("*.md"))


def headings_of(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {anchor(m[1]) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(README.parent).as_posix())
def test_every_link_between_the_documents_resolves(path: Path) -> None:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{path.name}: {target}: no such file"
        if fragment:
            assert fragment in headings_of(linked), f"{path.name}: {target}: no such heading"


def test_the_readme_reaches_kubernetes_within_its_first_screens() -> None:
    # A platform engineer's way in: what it is and where to start on the
    # first screen, the Kubernetes steps soon after the contents.
    lines = README.read_text().splitlines()
    assert lines.index("## Kubernetes in five steps") < 100
    assert "Where to start:" in lines[:25]


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.relative_to(README.parent).as_posix())
def test_every_source_file_named_exists(path: Path) -> None:
    # Code moves; a document naming a file that is gone sends its reader nowhere.
    named = re.findall(
        r"\b((?:sriov_cni|shim|deploy|tests|docs)/[\w./-]*\w\.(?:py|c|sh|yaml|json|md|conf|conflist))\b",
        path.read_text(),
    )
    missing = sorted({n for n in named if not (README.parent / n).exists()})
    assert missing == []
