"""The documentation's promises that a test can keep: every link in the README and
docs/ resolves inside the repository (files and #anchors), the README stays a front
page that gets a CPU user to the two commands without a CUDA download, the
contract keeps the section numbers the code cites, and no page reads like a diary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def prose(text: str) -> str:
    """The page without its fenced code blocks (which hold commands, not links)."""
    return FENCE.sub("", text)


def anchors(text: str) -> set[str]:
    """The #fragments GitHub gives a page's headings: lower case, everything but
    letters, digits, spaces, hyphens and underscores dropped, spaces made hyphens,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def link_problems(page: Path, text: str | None = None) -> list[str]:
    """Links of `page` (its text, unless given) that do not resolve in the repository."""
    text = page.read_text() if text is None else text
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file_part, _, fragment = target.partition("#")
        path = (page.parent / file_part).resolve()
        where = f"{page.relative_to(ROOT)} -> {target}"
        if ROOT not in path.parents and path != ROOT:
            problems.append(f"{where}: outside the repository")
        elif file_part and not path.exists():
            problems.append(f"{where}: no such file")
        elif fragment and (not file_part or path.suffix == ".md"):
            headings = anchors(text if not file_part else path.read_text())
            if fragment not in headings:
                problems.append(f"{where}: no heading with that anchor")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page):
    assert link_problems(page) == []


def test_the_link_checker_can_fail():
    text = ("# A page\n[a](missing.md) [b](contract.md#no-such-heading) [c](../../outside.md)\n"
            "[d](contract.md#1-words-and-symbols) [e](#a-page) [f](#no-such-heading-here)\n"
            "```\n[g](in-a-code-block.md)\n```\n")
    problems = "\n".join(link_problems(ROOT / "docs" / "page.md", text))
    assert "missing.md: no such file" in problems
    assert "contract.md#no-such-heading: no heading with that anchor" in problems
    assert "outside the repository" in problems
    assert "#no-such-heading-here: no heading" in problems
    assert "words-and-symbols" not in problems and "#a-page" not in problems
    assert "in-a-code-block" not in problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_reads_like_a_diary_or_points_outside(page):
    text = page.read_text()
    # Spelt in pieces, so that a search of the repository for them finds no page, this test included.
    for phrase in ("this" + " round", "last" + " round", "device" + " time", "../" + "shared", "SPEC" + ".md"):
        assert phrase.lower() not in text.lower(), f"{page.name} says {phrase!r}"


def test_the_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250 and len(text.encode()) <= 15_000
    for page in ("docs/contract.md", "docs/cli.md", "docs/plugins.md", "docs/design.md", "docs/results.md"):
        assert f"]({page})" in text, f"the README does not link {page}"
    # A CPU user reads the CPU-torch advice before any command that would install torch.
    cpu_torch = text.index("--index-url https://download.pytorch.org/whl/cpu")
    assert cpu_torch < text.index("pip install -e '.[test]'")
    assert "blocktable fuzz" in text and "pytest -n auto" in text


def test_the_contract_keeps_the_section_numbers_the_code_cites():
    headings = re.findall(r"^## §(\d+)\. ", (ROOT / "docs" / "contract.md").read_text(), re.M)
    assert headings == [str(n) for n in range(1, 12)]
