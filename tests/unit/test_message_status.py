"""One message's status document (delay_service/queries/message_status.py): pending or what became
of it, and the id's history, from a real store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kdelay.buffer import ORDER_SHIFT, Cancel, Fate, Scheduled
from kdelay.delay_service.queries.message_status import (
    message_status,
    outcome_status,
    pending_status,
)
from kdelay.delay_service.store.entry import Entry, entry_key
from kdelay.delay_service.store.outcomes import (
    CANCELLED,
    DEAD_LETTERED,
    DELIVERED,
    HISTORY_MAX,
    Outcome,
)
from kdelay.delay_service.store.store import Store

MIN = 60_000
NOW = 1_800_000_000_000 - 1_800_000_000_000 % MIN + 30_000
ACCEPTED = NOW - 3 * MIN


def sched(
    msg_id: str, at: int, topic: str = "orders", partition: int = 0, **extra: Any
) -> Scheduled:
    """Message ``msg_id`` due at ``at``; each its own buffer key (a reused id's is new)."""
    extra.setdefault("uid", f"uid-{msg_id}-{at}")
    return Scheduled(msg_id, topic, partition, None, b"v", at, **extra)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store")
    yield s
    s.close()


def fill(store: Store, messages: list[Scheduled | Cancel], partition: int = 0) -> None:
    """Apply ``messages`` as the next buffer records of ``partition``."""
    start = store.offsets().get(partition, 0)
    records = [(partition, start + i, m) for i, m in enumerate(messages)]
    store.apply(records, {partition: start + len(messages)})


def release(store: Store, msg_id: str, fate: Fate) -> None:
    """The master's removal of ``msg_id``'s pending entry, with what became of it."""
    entry = store.get(msg_id)
    assert entry is not None
    store.remove([entry], {entry.key: fate})


def test_a_pending_message_reports_due_time_target_headers_and_buffer_position(
    store: Store,
) -> None:
    headers = (("trace", b"abc"), ("bin", b"\xff\x00"), ("none", None))
    fill(
        store,
        [sched("other", NOW), sched("m", NOW + 5 * MIN, "orders", 3, headers=headers)],
        partition=2,
    )
    doc = message_status(store, "m")
    assert doc == {
        "id": "m",
        "state": "pending",
        "deliver_at": NOW + 5 * MIN,
        "topic": "orders",
        "partition": 3,
        "buffer": {"partition": 2, "offset": 1, "key": f"uid-m-{NOW + 5 * MIN}"},
        "headers": [
            {"key": "trace", "value": "abc"},
            {"key": "bin", "value_base64": "/wA="},
            {"key": "none", "value": None},
        ],
        "history": [],  # no acceptance stamp: not written by a proxy
    }
    assert message_status(store, "nobody") is None


def test_a_message_partitioned_by_key_has_no_partition_yet(store: Store) -> None:
    fill(store, [sched("k", NOW, partition=-1)])
    doc = message_status(store, "k")
    assert doc is not None
    assert doc["partition"] is None


def test_a_recurring_message_reports_its_series_and_occurrence() -> None:
    msg = sched("r", NOW, repeat="R5/PT1S", occurrence=2)
    doc = pending_status(Entry(entry_key(NOW, 0, 7), msg, 0, 7))
    assert (doc["repeat"], doc["occurrence"]) == ("R5/PT1S", 2)
    assert "repeat" not in pending_status(Entry(entry_key(NOW, 0, 8), sched("once", NOW), 0, 8))


def test_outcome_documents_name_the_time_of_each_state() -> None:
    delivered = Outcome("d", DELIVERED, "master", NOW, "orders", 1, 42, NOW + 7)
    assert outcome_status(delivered) == {
        "id": "d",
        "state": "delivered",
        "deliver_at": NOW,
        "topic": "orders",
        "partition": 1,
        "offset": 42,
        "released_at": NOW + 7,
        "source": "master",
    }
    cancelled = outcome_status(
        Outcome("c", CANCELLED, "cancel", NOW, "orders", 0, None, NOW - 9, by="bob")
    )
    assert (cancelled["state"], cancelled["cancelled_at"]) == ("cancelled", NOW - 9)
    assert cancelled["cancelled_by"] == {"principal": "bob", "admin": False}
    assert "released_at" not in cancelled
    dead = outcome_status(
        Outcome("x", DEAD_LETTERED, "tombstone", NOW, "gone", 0, 3, NOW + 1, reason="E: why")
    )
    assert (dead["state"], dead["released_at"], dead["offset"]) == ("dead_lettered", NOW + 1, 3)
    assert dead["reason"] == "E: why"
    series = outcome_status(Outcome("s", DELIVERED, "master", NOW, "t", 0, 1, NOW, occurrence=4))
    assert series["occurrence"] == 4


def test_the_history_tells_each_occurrence_its_lateness_a_dead_letters_reason_and_the_canceller(
    store: Store,
) -> None:
    """A series alice scheduled: occurrence 1 released 25 ms late, 2 dead-lettered, 3 cancelled
    by alice, 4 pending."""
    seq = (ACCEPTED << ORDER_SHIFT) | 1
    series: dict[str, Any] = {"repeat": "R5/PT1M", "owner": "alice", "seq": seq}
    fill(store, [sched("s", NOW, occurrence=1, **series)])
    release(store, "s", Fate(DELIVERED, "orders", 0, 11, NOW + 25, NOW, 1, None, ACCEPTED, "alice"))
    fill(store, [sched("s", NOW + MIN, occurrence=2, **series)])
    reason = "MSG_SIZE_TOO_LARGE: Broker: Message size too large"
    dead = Fate(
        DEAD_LETTERED, "orders", 0, None, NOW + MIN + 4, NOW + MIN, 2, reason, ACCEPTED, "alice"
    )
    release(store, "s", dead)
    fill(store, [sched("s", NOW + 2 * MIN, occurrence=3, **series), Cancel("s", owner="alice")])
    # (a week later: no cancel read before it is still open for it)
    later = {**series, "seq": ((ACCEPTED + 7 * 86_400_000) << ORDER_SHIFT) | 1}
    fill(store, [sched("s", NOW + 3 * MIN, occurrence=4, **later)])

    doc = message_status(store, "s")
    assert doc is not None
    assert (doc["state"], doc["occurrence"]) == ("pending", 4)
    assert doc["last_outcome"]["cancelled_by"] == {"principal": "alice", "admin": False}
    assert {e.get("owner") for e in doc["history"]} == {"alice"}  # whose message each is
    events = [{k: v for k, v in e.items() if k not in ("source", "owner")} for e in doc["history"]]
    accepted = {"event": "accepted", "at": ACCEPTED, "by": "alice"}
    assert events == [
        {**accepted, "deliver_at": NOW, "occurrence": 1},
        {
            "event": "delivered",
            "at": NOW + 25,
            "deliver_at": NOW,
            "occurrence": 1,
            "topic": "orders",
            "partition": 0,
            "offset": 11,
            "lateness_ms": 25,
        },
        {**accepted, "deliver_at": NOW + MIN, "occurrence": 2},
        {
            "event": "dead_lettered",
            "at": NOW + MIN + 4,
            "deliver_at": NOW + MIN,
            "occurrence": 2,
            "topic": "orders",
            "partition": 0,
            "offset": None,
            "lateness_ms": 4,
            "reason": reason,
        },
        {**accepted, "deliver_at": NOW + 2 * MIN, "occurrence": 3},
        {
            "event": "cancelled",
            "at": None,  # the cancel's append time: none in this test's records
            "deliver_at": NOW + 2 * MIN,
            "occurrence": 3,
            "by": {"principal": "alice", "admin": False},
        },
        {**accepted, "at": ACCEPTED + 7 * 86_400_000, "deliver_at": NOW + 3 * MIN, "occurrence": 4},
    ]


def test_a_richer_word_on_the_same_release_replaces_it_in_place(store: Store) -> None:
    """The master's own outcome, then its tombstone (poorer) and a checkpoint (poorest): one
    event, not three; the history grows only with another release."""
    fill(store, [sched("m", NOW)])
    release(store, "m", Fate(DELIVERED, "orders", 0, 5, NOW + 3, NOW))
    history = store.history("m")
    assert [(o.state, o.source, o.offset) for o in history] == [(DELIVERED, "master", 5)]
    fill(store, [sched("m", NOW + MIN)])
    release(store, "m", Fate(DEAD_LETTERED, "orders", 0, None, NOW + MIN, NOW + MIN, None, "E"))
    assert [(o.state, o.reason) for o in store.history("m")] == [
        (DELIVERED, None),
        (DEAD_LETTERED, "E"),
    ]


def test_the_history_keeps_the_last_outcomes_only(store: Store) -> None:
    for i in range(HISTORY_MAX + 5):
        fill(store, [sched("m", NOW + i)])
        release(store, "m", Fate(DELIVERED, "orders", 0, i, NOW + i + 1, NOW + i))
    history = store.history("m")
    assert len(history) == HISTORY_MAX + 1
    assert [o.offset for o in history] == list(range(4, HISTORY_MAX + 5))
    assert store.outcome("m") == history[-1]


def test_a_replaced_message_stays_in_the_history_with_who_replaced_it(store: Store) -> None:
    seq = (ACCEPTED << ORDER_SHIFT) | 1
    fill(store, [sched("r", NOW, owner="alice", seq=seq)])
    later = ((ACCEPTED + MIN) << ORDER_SHIFT) | 1
    fill(store, [sched("r", NOW + MIN, owner="alice", seq=later, replace=True)])
    doc = message_status(store, "r")
    assert doc is not None
    assert (doc["state"], doc["deliver_at"]) == ("pending", NOW + MIN)
    assert doc["last_outcome"]["replaced_by"] == {"principal": "alice", "admin": False}
    assert [(e["event"], e["deliver_at"], e["by"]) for e in doc["history"]] == [
        ("accepted", NOW, "alice"),
        ("replaced", NOW, {"principal": "alice", "admin": False}),
        ("accepted", NOW + MIN, "alice"),
    ]
