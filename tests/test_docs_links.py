"""The README is the front door to the guide: it links every page of docs/guide/, and every relative
link in the README, CONTRIBUTING.md and docs/ leads somewhere — a file that exists and, for
`page.md#anchor`, a heading of that page (GitHub's slugs). External links are not fetched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return _CODE.sub("", _FENCE.sub("", text))


def links(page: Path) -> list[str]:
    """Every link target of a page, as written (`path`, `path#anchor`, `#anchor`, `https://…`)."""
    return _LINK.findall(_prose(page.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links by their words, code without backticks),
    lowercased, punctuation dropped except `-` and `_`, each space a `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a page's headings make; a repeated heading gets `-1`, `-2`, … as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken(page: Path) -> list[str]:
    """The page's relative links that lead nowhere, each with the reason."""
    bad = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: — not fetched
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return bad


def test_the_guide_has_pages():
    assert len(GUIDE) >= 10
    assert ROOT / "docs" / "guide" / "README.md" in GUIDE


def test_the_readme_links_every_guide_page():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md") if not t.startswith("#")}
    assert [p.relative_to(ROOT).as_posix() for p in GUIDE if p not in linked] == []


def test_the_readme_links_the_contributor_pages():
    targets = set(links(ROOT / "README.md"))
    for page in ("CONTRIBUTING.md", "docs/benchmarks.md", "docs/architecture.md", "docs/reliability.md"):
        assert page in targets, page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_somewhere(page):
    assert broken(page) == []


def test_a_broken_link_or_anchor_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "guide.md").write_text("# The `%context` view\n\n## Your own words\n\n## Your own words\n",
                                       encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text("[ok](guide.md#the-context-view) [ok](guide.md#your-own-words-1) [ok](#top)\n\n# Top\n"
                    "`[not a link](nowhere.md)` [web](https://example.com/x) ![img](guide.md)\n"
                    "[gone](missing.md) [bad anchor](guide.md#no-such-heading)\n", encoding="utf-8")
    assert broken(page) == ["missing.md: no file missing.md",
                            "guide.md#no-such-heading: no heading #no-such-heading in guide.md"]
