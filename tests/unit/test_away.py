"""A replica away longer than the buffer topic's delete.retention.ms rebuilds its store
(delay_service/away.py): it could not read the cancels and tombstones the cleaner removed
meanwhile, and would release a cancelled message it still holds."""

from __future__ import annotations

import json
from pathlib import Path

from kdelay.delay_service.away import (
    STAMP_FILE,
    SyncStamp,
    margin_ms,
    read_stamp,
    rebuild_if_away,
    write_stamp,
)

DAY = 86_400_000


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    (store / "CURRENT").write_text("x")
    return store


def test_a_store_away_longer_than_the_retention_is_removed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    write_stamp(tmp_path / STAMP_FILE, 1_000)
    assert rebuild_if_away(tmp_path, store, DAY, now_ms=1_000 + DAY)
    assert not store.exists()
    assert read_stamp(tmp_path) is None


def test_a_store_back_within_the_retention_less_the_margin_is_kept(tmp_path: Path) -> None:
    store = _store(tmp_path)
    write_stamp(tmp_path / STAMP_FILE, 1_000)
    limit = 1_000 + DAY - margin_ms(DAY)
    assert not rebuild_if_away(tmp_path, store, DAY, now_ms=limit - 1)
    assert store.exists()
    # The margin (clocks apart, a stale stamp) counts as away.
    assert rebuild_if_away(tmp_path, store, DAY, now_ms=limit)


def test_the_margin_is_at_most_ten_minutes_and_a_tenth_of_a_short_retention() -> None:
    assert margin_ms(DAY) == 600_000
    assert margin_ms(60_000) == 6_000


def test_a_store_without_a_stamp_or_no_store_is_left_alone(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert not rebuild_if_away(tmp_path, store, DAY, now_ms=10 * DAY)
    assert store.exists()
    (tmp_path / STAMP_FILE).write_text("not json")
    assert not rebuild_if_away(tmp_path, store, DAY, now_ms=10 * DAY)
    assert not rebuild_if_away(tmp_path / "other", tmp_path / "other" / "store", DAY, now_ms=0)


def test_the_stamp_is_written_when_synced_at_most_every_interval(tmp_path: Path) -> None:
    clock = iter([5_000, 6_000])
    stamp = SyncStamp(tmp_path, wall_ms=lambda: next(clock))
    stamp.synced()
    stamp.synced()  # within the interval: not rewritten
    assert json.loads((tmp_path / STAMP_FILE).read_text()) == {"synced_at_ms": 5_000}
