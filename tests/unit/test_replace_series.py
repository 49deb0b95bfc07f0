"""A replace with ``repeat`` keeps its whole series.

The replace is a cancel of its id at its own position and a new message, the first occurrence
of a series; its later occurrences are written to the buffer topic by the master as it
releases each one (delay_service/release/series.py), with occurrence 1's order field. They belong to
the replacement, so the replace's own cancel part must not cancel them, while any cancel or
replace appended after it still stops them (delay_service/store/cancels.py, store/writes.py).
Each occurrence here goes the real way: the due entry, its next occurrence as the sender
builds it, decoded from its buffer record as ingest decodes it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay import buffer
from kdelay.buffer import Cancel, Scheduled
from kdelay.delay_service.release.series import next_occurrence
from kdelay.delay_service.store.store import Store

T0 = 1_700_000_000_000
DUE = T0 + 1_000


def sched(
    uid: str, accepted: int, *, replace: bool = False, repeat: str | None = None
) -> Scheduled:
    return Scheduled(
        "x", "t", 0, None, uid.encode(), DUE, uid=uid, seq=accepted << 20, replace=replace,
        repeat=repeat,
    )  # fmt: skip


class Buffer:
    """One buffer partition's offsets, and a store fed from it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = Store(path)
        self.offset = 0

    def append(self, record: Scheduled | Cancel, time_ms: int) -> None:
        self.offset += 1
        self.store.apply([(0, self.offset - 1, record, time_ms)], {0: self.offset})

    def reopen(self) -> None:
        self.store.close()
        self.store = Store(self.path)

    def pending(self) -> list[str]:
        return [e.message.uid for e in self.store.due(2**62, 1000)]

    def release_next(self, time_ms: int) -> str:
        """Release the first pending entry as the master does: delete it, and append its next
        occurrence (decoded from the record the sender writes) at ``time_ms``; its buffer key."""
        entry = self.store.due(2**62, 1)[0]
        out = next_occurrence(entry, buffer.BUFFER_TOPIC)
        assert out is not None
        headers = [(k, v.encode() if isinstance(v, str) else v) for k, v in out.headers]
        record = buffer.decode(out.key, out.value, headers)
        assert isinstance(record, Scheduled)
        self.store.remove([entry])
        self.append(record, time_ms)
        return record.uid


@pytest.fixture
def part(tmp_path: Path) -> Iterator[Buffer]:
    b = Buffer(tmp_path / "db")
    yield b
    b.store.close()


def test_a_replace_with_repeat_keeps_every_occurrence(part: Buffer) -> None:
    part.append(sched("m1", T0 - 5_000), T0 - 4_999)  # the pending message it replaces
    part.append(sched("r1", T0, replace=True, repeat="R5/PT1S"), T0 + 1)
    assert part.pending() == ["r1"]
    written = [part.release_next(T0 + 1_001 + 1_000 * n) for n in range(4)]
    assert written == ["r1#2", "r1#3", "r1#4", "r1#5"]
    assert part.pending() == ["r1#5"]  # every occurrence reached the store; the last is due


def test_it_holds_for_a_replica_that_restarted_in_between(part: Buffer) -> None:
    part.append(sched("r1", T0, replace=True, repeat="R3/PT1S"), T0 + 1)
    part.reopen()  # the open cancel of the replace is read back from RocksDB
    assert part.release_next(T0 + 1_001) == "r1#2"
    assert part.pending() == ["r1#2"]


def test_a_cancel_after_the_replace_still_stops_the_series(part: Buffer) -> None:
    part.append(sched("r1", T0, replace=True, repeat="R5/PT1S"), T0 + 1)
    part.release_next(T0 + 1_001)
    part.append(Cancel("x", "c1"), T0 + 1_500)  # removes occurrence 2, pending
    assert part.pending() == []
    # Occurrence 3 written just after the cancel (occurrence 2 was in a release round then):
    # occurrence 1's order field, sent before the cancel, so the cancel wins.
    part.append(occurrence(sched("r1", T0, repeat="R5/PT1S"), 3), T0 + 1_600)
    assert part.pending() == []


def test_a_later_replace_stops_the_earlier_series_and_keeps_its_own(part: Buffer) -> None:
    part.append(sched("r1", T0, replace=True, repeat="R5/PT1S"), T0 + 1)
    part.append(sched("r2", T0 + 500, replace=True, repeat="R3/PT1S"), T0 + 501)
    assert part.pending() == ["r2"]
    # r1's occurrence 2, written after r2 by a round that released occurrence 1 with it.
    late = occurrence(sched("r1", T0, repeat="R5/PT1S"), 2)
    part.append(late, T0 + 600)
    assert part.pending() == ["r2"]
    assert part.release_next(T0 + 1_600) == "r2#2"
    assert part.pending() == ["r2#2"]


def occurrence(first: Scheduled, n: int) -> Scheduled:
    """Occurrence ``n`` of the series ``first`` starts, as the master writes it."""
    return dataclasses.replace(first, uid=f"{first.uid}#{n}", occurrence=n)
