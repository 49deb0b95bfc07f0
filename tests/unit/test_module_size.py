"""No module of the product or the harness is over 400 lines (tests aside).

A module that long has become a corridor of several ideas; a newcomer should find one idea per
module, named for it (STYLE.md "Layout"). Checked: every ``.py`` file under the product's
packages and the harness's (``tests/`` is not counted). No module is exempt.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kdelay", "proxy", "delay_service", "zk", "verifier", "dev", "bench")
LIMIT = 400


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _modules() -> dict[str, int]:
    """Every module of PACKAGES (caches and hidden directories aside) -> its line count."""
    found: dict[str, int] = {}
    for name in PACKAGES:
        for path in sorted((ROOT / name).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if any(part.startswith((".", "__pycache__")) for part in rel.parts):
                continue
            found[rel.as_posix()] = _lines(path)
    return found


def test_the_packages_hold_modules() -> None:
    modules = _modules()
    assert "delay_service/store/store.py" in modules
    assert "verifier/job.py" in modules


def test_no_module_is_over_the_limit() -> None:
    over = {path: lines for path, lines in _modules().items() if lines > LIMIT}
    assert over == {}, f"over {LIMIT} lines: split each by what it does (STYLE.md)"
