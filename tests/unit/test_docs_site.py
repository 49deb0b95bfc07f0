"""The manual (docs/, mkdocs.yml) builds with ``mkdocs build --strict``, and the README's links
resolve.

The build runs in this process into a temporary directory, with the validation mkdocs.yml sets:
a link to a page that does not exist, an anchor a page lacks, an absolute link or one mkdocs
cannot place is a warning, and --strict turns any warning into a failure. The README is not part
of the site (it is the forge's front page, linking into docs/ by path), so its relative links are
checked here: each names a file of the checkout and, with ``#anchor``, a heading of that file, by
the forge's slug and by the site's (Python-Markdown's toc) alike.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _build(tmp_path: Path, docs_dir: Path | None = None) -> list[str]:
    """Build the site into ``tmp_path``; the warnings it logged (empty when it built clean)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    overrides: dict[str, Any] = {"site_dir": str(tmp_path / "site"), "strict": True}
    if docs_dir is not None:
        overrides["docs_dir"] = str(docs_dir)
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("mkdocs")
    logger.addHandler(handler)
    try:
        build(load_config(str(ROOT / "mkdocs.yml"), **overrides))
    except Abort:
        assert warnings, "mkdocs aborted without a warning"
    finally:
        logger.removeHandler(handler)
    return warnings


def test_site_builds_with_no_warning(tmp_path: Path) -> None:
    assert _build(tmp_path) == []
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "guarantees" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """The check itself: a copy of docs/ with a link to no page and one to no anchor."""
    import shutil

    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, symlinks=False)
    page = docs / "index.md"
    page.write_text(
        page.read_text() + "\n[gone](no-such-page.md) [nowhere](guarantees.md#no-such-anchor)\n"
    )
    warnings = _build(tmp_path, docs)
    assert any("no-such-page.md" in w for w in warnings), warnings
    assert any("no-such-anchor" in w for w in warnings), warnings


def _github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _toc_slug(text: str) -> str:
    from markdown.extensions.toc import slugify

    return str(slugify(text, "-"))


def _headings(path: Path) -> list[str]:
    """The text of each heading of a Markdown file, outside code fences, as rendered."""
    out, fence = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        match = None if fence else _HEADING.match(line)
        if match:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(2))  # a link: its text
            out.append(text.replace("`", ""))
    return out


def _readme_links() -> list[str]:
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    return [t for t in _LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


def test_readme_links_into_docs() -> None:
    links = _readme_links()
    assert any(link.startswith("docs/") for link in links), "the README links to no page of docs/"
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), f"README links to {link}: no such file"
        if anchor:
            headings = _headings(target)
            assert anchor in {_github_slug(h) for h in headings}, f"README: {link} (forge)"
            assert anchor in {_toc_slug(h) for h in headings}, f"README: {link} (site)"


def test_readme_link_check_sees_a_missing_anchor() -> None:
    headings = _headings(ROOT / "docs" / "security.md")
    slugs = {_github_slug(h) for h in headings}
    assert "least-privilege-the-acls-each-component-needs" in slugs
    assert "no-such-section" not in slugs
