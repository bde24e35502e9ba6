"""The README's table of contents lists every section, in order, with links GitHub resolves."""

from __future__ import annotations

import re
from pathlib import Path

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
