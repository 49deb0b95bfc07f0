"""``@immutable`` value types keep a frozen dataclass's value semantics (mypy enforces the rest)."""

from __future__ import annotations

import dataclasses

from kdelay.buffer import Fate, Scheduled, Tombstone
from kdelay.immutable import immutable


@immutable
class Point:
    x: int
    tags: tuple[str, ...] = dataclasses.field(default=())


def test_equality_and_hash_are_by_value() -> None:
    assert Point(1, ("a",)) == Point(1, ("a",))
    assert Point(1) != Point(2)
    assert hash(Point(1, ("a",))) == hash(Point(1, ("a",)))
    assert len({Point(1), Point(1), Point(2)}) == 2


def test_slotted_with_defaults_and_replace() -> None:
    p = Point(1)
    assert not hasattr(p, "__dict__")
    assert dataclasses.replace(p, x=3) == Point(3)
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "tags"]


def test_the_buffer_records_are_values() -> None:
    fate = Fate("delivered", "t", 1, 9, 2, 3, None)
    assert Tombstone("a", 7, "u", fate) == Tombstone("a", 7, "u", fate)
    msg = Scheduled("a", "t", 0, None, b"v", 10)
    assert {msg, dataclasses.replace(msg)} == {msg}
