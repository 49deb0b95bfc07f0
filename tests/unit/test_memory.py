"""kdelay.memory: start-up objects frozen out of the cyclic collector's walks."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from kdelay import memory


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def _walked(obj: object) -> bool:
    """Whether a collection walks ``obj`` (gc.get_objects lists generations 0-2, not the
    permanent one)."""
    return any(o is obj for o in gc.get_objects())


def test_objects_alive_at_start_up_are_no_longer_walked_and_stay_alive() -> None:
    kept = [_Node() for _ in range(100)]
    assert _walked(kept[0])
    frozen = memory.freeze_startup_objects()
    # Not equal to a later gc.get_freeze_count(): in a full test session other threads (the
    # clients of earlier tests) may free frozen objects in between (seen: 279,443 -> 279,441).
    assert frozen >= len(kept)
    assert gc.get_freeze_count() >= len(kept)
    assert not any(_walked(n) for n in kept[:3])
    gc.collect()
    assert all(n.me is n for n in kept)


def test_garbage_is_collected_first_and_later_cycles_still_are() -> None:
    garbage = [weakref.ref(_Node()) for _ in range(100)]  # cycles nothing refers to
    memory.freeze_startup_objects()
    assert all(ref() is None for ref in garbage)  # freed, not frozen
    later = [weakref.ref(_Node()) for _ in range(100)]
    gc.collect()
    assert all(ref() is None for ref in later)


def test_the_young_generation_is_collected_less_often_and_cycles_still_are() -> None:
    before = gc.get_threshold()
    try:
        memory.collect_young_less_often(5_000)
        assert gc.get_threshold() == (5_000, before[1], before[2])
        garbage = [weakref.ref(_Node()) for _ in range(20_000)]  # past the threshold
        assert all(ref() is None for ref in garbage[:1_000])  # collected without gc.collect()
    finally:
        gc.set_threshold(*before)
