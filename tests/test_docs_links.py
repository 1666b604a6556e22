"""Every relative link in README.md and docs/*.md points at a file that exists, and every
`#anchor` at a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces
to hyphens, repeats numbered)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.M)


def prose(text: str) -> str:
    """The document without its fenced code blocks (a `[x](y)` there is code, not a link)."""
    return FENCE.sub("", text)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(path.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_the_documents_have_links_to_check() -> None:
    assert len(DOCUMENTS) >= 3
    assert any("#" in link for link in relative_links(REPO / "README.md"))


def test_anchors_follow_github() -> None:
    readme_anchors = anchors(REPO / "README.md")
    assert "quick-start" in readme_anchors
    assert "train-models-for-your-fleet" in readme_anchors


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for link in relative_links(document):
        target, _, anchor = link.partition("#")
        path = (document.parent / target).resolve() if target else document
        if not path.exists():
            broken.append(f"{link}: no file {path.relative_to(REPO)}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no heading with anchor #{anchor} in {path.name}")
    assert not broken, f"{document.relative_to(REPO)}: broken links:\n" + "\n".join(broken)
