"""Suites that run only when asked for (tests/deploy/containers, tests/deploy/k8s, tests/spark):
marked, and deselected from every other run, so `make test` reports them as deselected, never
as skipped or passed."""

from __future__ import annotations

from pathlib import Path

import pytest


def mark_or_deselect(
    config: pytest.Config,
    items: list[pytest.Item],
    here: Path,
    marker: pytest.MarkDecorator,
    *,
    asked: bool,
) -> None:
    """Mark the collected tests under ``here`` with ``marker``; unless ``asked``, deselect
    them."""
    mine = [i for i in items if here in Path(str(i.fspath)).resolve().parents]
    for item in mine:
        item.add_marker(marker)
    if not mine or asked:
        return
    config.hook.pytest_deselected(items=mine)
    chosen = set(mine)
    items[:] = [i for i in items if i not in chosen]
