"""Code says what and why, never which issue or which run asked for it: an "issue N" in a
comment or docstring means nothing to a reader of the code (the history is in git and the
CHANGELOG). Every Python file of the product, the harness, the benches and the tests."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ["kdelay", "proxy", "delay_service", "zk", "verifier", "dev", "bench", "tests"]
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")


def test_no_code_names_an_issue() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
        for tree in TREES
        for path in sorted((ROOT / tree).rglob("*.py"))
        if ".venv" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE.search(line) and path != Path(__file__).resolve()
    ]
    assert found == []
