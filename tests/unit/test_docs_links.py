"""Every relative link and ``#anchor`` in README.md and docs/*.md resolves.

Anchors follow GitHub's rules: a heading's slug is its text lower-cased, with punctuation other
than ``-`` and ``_`` dropped and each space turned into ``-`` (``## Install into an existing
Lvllm / vLLM environment`` -> ``#install-into-an-existing-lvllm--vllm-environment``); a repeated
slug gets ``-1``, ``-2``, ...; ``<a id="...">`` / ``<a name="...">`` define anchors too.  Fenced
code blocks and inline code are not markdown, so neither their headings nor their links count.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"^\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else (fence or marker.group(1))
            continue
        if fence is None:
            out.append(line)
    return out


def slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(path.read_text()):
        found.update(HTML_ANCHOR.findall(line))
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    out = []
    for line in prose(path.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        out += LINK.findall(line)
    return out


def test_the_slugs_follow_githubs_rules():
    assert slug("Install into an existing Lvllm / vLLM environment") == "install-into-an-existing-lvllm--vllm-environment"
    assert slug("`--reasoning-parser` and `base_method`") == "--reasoning-parser-and-base_method"
    assert slug("On a narrower shape: learning without losing") == "on-a-narrower-shape-learning-without-losing"
    assert slug("What is [verified](x.md) where?") == "what-is-verified-where"


def test_headings_in_code_blocks_are_not_anchors(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n```bash\n# not a heading\n```\n\n## Title\n<a id=\"here\"></a>\n")
    assert anchors(page) == {"title", "title-1", "here"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...: not checked here
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: {dest.relative_to(ROOT) if ROOT in dest.parents else dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading or anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_stays_short_and_shows_the_launch_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    first_screen = "\n".join(lines[:40])
    assert "dspark-dynamic-launch --preset deepseek-v4-flash-lvllm" in first_screen
