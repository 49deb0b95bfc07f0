"""The streaming verifier's cancel bookkeeping: a cancel counts only for what it follows."""

from __future__ import annotations

from verifier.stream import CancelRegistry


def test_a_cancel_applies_only_to_schedules_before_it_in_its_partition() -> None:
    registry = CancelRegistry()
    registry.add([("a", 0, 10), ("a", 0, 30), ("b", 1, 5)])
    registry.add([("a", 0, 20)])  # an older position never replaces a later one
    schedules = [
        ("a", 0, 25),  # followed by the cancel at 30
        ("a", 0, 40),  # scheduled again after every cancel: not cancelled
        ("a", 1, 1),  # another partition: not this cancel's
        ("b", 1, 5),  # the cancel itself is not after it
        ("c", 0, 0),
    ]
    assert registry.following(schedules) == [("a", 0, 30)]
