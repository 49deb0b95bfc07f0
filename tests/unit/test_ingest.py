"""Ingest with in-process fakes (tests/support/fakes.py's FakeConsumer, a ``BufferConsumer``):
partition assignment, catch-up, poison records, the master's own tombstones, cancels."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, Message
from structlog.testing import capture_logs

from kdelay.buffer import (
    BUFFER_TOPIC,
    DEAD_LETTER_TOPIC,
    ROUTE_HEADER,
    Cancel,
    Fate,
    Scheduled,
    Tombstone,
    encode,
)
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.errors import StoreError
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.ingest.poison import ERROR_HEADER, SOURCE_HEADER
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.store import Store
from kdelay.delay_service.store.tombstones import Retired
from tests.support.fakes import FakeConsumer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def test_a_partition_without_a_leader_yet_is_retried_not_wedged(store: Store) -> None:
    ingest = Ingest(ReplicaConfig(name="r"), store, Metrics())
    consumer = FakeConsumer(high={0: 0, 1: 0, 2: 0}, leaderless={2})

    assert ingest.assign_new(consumer) is False
    assert sorted(consumer.assigned) == [0, 1]
    ingest.check_caught_up(consumer)
    assert not ingest.caught_up.is_set(), "caught up while a partition was never read"

    consumer.leaderless.clear()
    assert ingest.assign_new(consumer) is True
    assert consumer.assigned == {0: OFFSET_BEGINNING, 1: OFFSET_BEGINNING, 2: OFFSET_BEGINNING}
    ingest.check_caught_up(consumer)
    assert ingest.caught_up.is_set()
    assert ingest.assign_new(consumer) is True


def test_catch_up_waits_for_the_end_of_every_partition(store: Store) -> None:
    ingest = Ingest(ReplicaConfig(name="r", buffer_topic=BUFFER_TOPIC), store, Metrics())
    consumer = FakeConsumer(high={0: 3, 1: 0})

    assert ingest.assign_new(consumer) is True
    ingest.check_caught_up(consumer)
    assert not ingest.caught_up.is_set()

    store.apply([(0, 0, None), (0, 1, None), (0, 2, None)], {0: 3})
    ingest.check_caught_up(consumer)
    assert ingest.caught_up.is_set()


def record(
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] | None,
    *,
    ts: int = 1_000,
) -> Message:
    """A consumed buffer record, stamped with CreateTime ``ts``."""
    return Message(
        topic="buf",
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=list(headers) if headers is not None else None,
        timestamp=(TIMESTAMP_CREATE_TIME, ts),
    )


def own_headers(msg: Message) -> list[tuple[str, bytes]]:
    """A record's headers as ingest keeps them on a dead-letter entry (None as empty)."""
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(n, v.encode() if isinstance(v, str) else v or b"") for n, v in items]


def route(obj: dict[str, object]) -> tuple[str, bytes]:
    return ROUTE_HEADER, json.dumps(obj).encode()


def _route(msg: Scheduled) -> dict[str, object]:
    headers = encode(msg).headers
    return dict(json.loads(headers[-1][1] or b""))


GOOD = Scheduled("ok", "t", 0, None, b"v", 5_000, uid="u-ok")
#: 65,536 headers: the record that stopped every replica's ingest with entry format version 1.
MANY = Scheduled("many", "t", 0, None, b"", 6_000, (("", b""),) * 65_536, uid="u-many")
POISON = [
    # no route header at all, a null value among the headers
    record(0, 0, b"a", b"x", [("h", None)]),
    # a route header that is not JSON
    record(0, 1, b"b", b"x", [(ROUTE_HEADER, b"{nope")]),
    # a format version from the future
    record(0, 2, b"c", b"x", [route({"v": 99, "op": "schedule"})]),
    # a schedule whose fields are missing (truncated route)
    record(1, 0, b"d", b"x", [route({"v": 1, "op": "schedule", "t": "t"})]),
    # a due time no store can hold (unstorable), and a topic with a lone surrogate (JSON
    # escapes allow it; the route's parser refuses it: undecodable)
    record(1, 1, b"e", b"", [route({**_route(GOOD), "d": 2**70})]),
    record(1, 2, b"f", b"", [route({**_route(GOOD), "t": "\ud800"})]),
    # no key at all
    record(2, 0, None, b"x", [route(_route(GOOD))], ts=7),
]


def test_poison_records_become_dead_letter_entries_and_ingest_goes_on(store: Store) -> None:
    metrics = Metrics()
    ingest = Ingest(ReplicaConfig(name="r", buffer_topic="buf"), store, metrics)
    good, many = encode(GOOD), encode(MANY)
    messages = [
        *POISON,
        record(3, 0, good.key, good.value, list(good.headers)),
        record(3, 1, many.key, many.value, list(many.headers)),
    ]

    ingest.apply(messages)

    assert store.offsets() == {0: 3, 1: 3, 2: 1, 3: 2}
    stored = store.get("many")
    assert stored is not None
    assert stored.message == MANY
    assert store.get("ok") is not None
    due = store.due(2**62, limit=100)
    dead = {e.message.id: e.message for e in due if e.message.id not in ("ok", "many")}
    assert len(dead) == len(POISON)
    for msg in POISON:
        part, off = msg.partition(), msg.offset()
        entry = dead[f"kdelay-invalid/{part}/{off}"]
        assert (entry.topic, entry.partition) == (DEAD_LETTER_TOPIC, -1)
        assert (entry.key, entry.value) == (msg.key(), msg.value())
        # the record's own time: equal on every replica
        assert entry.deliver_at_ms == msg.timestamp()[1]
        headers = dict(entry.headers)
        assert (headers[ERROR_HEADER] or b"").startswith(b"invalid_buffer_record: ")
        assert headers[SOURCE_HEADER] == f"buf/{part}/{off}".encode()
        own = own_headers(msg)
        assert list(entry.headers[: len(own)]) == own
    assert b"beyond a signed 64-bit" in (
        dict(dead["kdelay-invalid/1/1"].headers)[ERROR_HEADER] or b""
    )
    invalid = metrics.registry.get_sample_value
    assert b"surrogate" in (dict(dead["kdelay-invalid/1/2"].headers)[ERROR_HEADER] or b"")
    assert invalid("kdelay_replica_invalid_records_total", {"reason": "undecodable"}) == 6
    assert invalid("kdelay_replica_invalid_records_total", {"reason": "unstorable"}) == 1
    assert invalid("kdelay_replica_ingested_total", {"kind": "invalid"}) == len(POISON)
    assert invalid("kdelay_replica_ingested_total", {"kind": "schedule"}) == 2


def test_the_masters_own_tombstones_are_skipped_undecoded_and_others_applied(
    store: Store,
) -> None:
    """A tombstone of a record this replica released as master is read back with nothing to
    tell it: ingest skips it before decoding (a header no decoder accepts proves it), once;
    a second record with that key, and other replicas' tombstones, go the long way."""
    metrics = Metrics()
    ingest = Ingest(ReplicaConfig(name="r", buffer_topic="buf"), store, metrics)
    mine = Scheduled("mine", "t", 0, None, b"v", 5_000, uid="u-mine")
    theirs = Scheduled("theirs", "t", 0, None, b"v", 5_000, uid="u-theirs")
    scheduled = [record(0, n, *_kafka(m)) for n, m in enumerate((mine, theirs))]
    ingest.apply(scheduled)
    released = next(e for e in store.due(5_000, limit=10) if e.message.id == "mine")
    store.remove([released], {released.key: Fate("delivered", "t", 0, 7, 5_001, 5_000)})
    undecodable: list[tuple[str, bytes | None]] = [(ROUTE_HEADER, b"{not json")]
    their_tombstone = _kafka(Tombstone("theirs", 1, "u-theirs", Fate("delivered", "t", 0, 8)))
    tombstones = [
        record(0, 2, b"u-mine", None, undecodable),  # ours: skipped undecoded
        record(0, 3, b"u-mine", None, undecodable),  # not ours any more: poison
        record(0, 4, *their_tombstone),  # another master's: applied
    ]
    ingest.apply(tombstones)
    assert store.offsets() == {0: 5}
    assert store.get("theirs") is None
    assert [e.message.id for e in store.due(2**62, limit=10)] == ["kdelay-invalid/0/3"]
    value = metrics.registry.get_sample_value
    assert value("kdelay_replica_ingested_total", {"kind": "tombstone"}) == 2
    assert value("kdelay_replica_invalid_records_total", {"reason": "undecodable"}) == 1


def _kafka(
    msg: Scheduled | Tombstone,
) -> tuple[bytes, bytes | None, list[tuple[str, bytes | None]]]:
    enc = encode(msg)
    return enc.key, enc.value, list(enc.headers)


def test_a_store_write_failure_ends_the_run_for_the_supervisor(store: Store) -> None:
    """Not the record's fault: ingest does not swallow it (the supervisor restarts ingest)."""
    ingest = Ingest(ReplicaConfig(name="r"), store, Metrics())
    good = encode(GOOD)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        ingest.apply([record(0, 0, good.key, good.value, list(good.headers))])


def test_a_cancel_read_before_its_message_cancels_it_by_the_records_own_times(
    store: Store,
) -> None:
    """The README's cancel example as the buffer topic holds it when the client's request
    listed the cancel's partition first: cancel, then message, in the id's buffer partition."""
    metrics = Metrics()
    ingest = Ingest(ReplicaConfig(name="r", buffer_topic="buf"), store, metrics)
    retired: list[Retired] = []
    ingest.on_cancelled = retired.extend
    appended = 1_700_000_000_000
    cancel = encode(Cancel("order-42", "c" * 32))
    message = encode(
        Scheduled("order-42", "orders", 0, b"k", b"v", 0, uid="s" * 32, seq=appended << 20)
    )
    other = encode(Tombstone("else", 1, "e" * 32))
    first = [
        record(2, 0, cancel.key, cancel.value, list(cancel.headers), ts=appended),
        record(2, 1, message.key, message.value, list(message.headers), ts=appended),
    ]
    ingest.apply(first)
    assert store.get("order-42") is None
    assert [r[:4] for r in retired] == [("order-42", "s" * 32, 2, 1)]
    sample = metrics.registry.get_sample_value
    assert sample("kdelay_replica_ingested_total", {"kind": "schedule"}) == 1
    assert sample("kdelay_replica_ingested_total", {"kind": "cancel"}) == 1
    # A record of that partition appended after the window closes it: the cancel's tombstone
    # follows the message's, again.
    later = appended + 300_001
    ingest.apply([record(2, 2, other.key, other.value, list(other.headers), ts=later)])
    assert [r[:4] for r in retired[1:]] == [
        ("order-42", "s" * 32, 2, 1),
        ("order-42", "c" * 32, 2, 0),
    ]


def test_a_shard_takes_only_its_partitions_and_says_when_they_do_not_suit_it(
    store: Store,
) -> None:
    """kdelay/shards.py: shard 1 of 2 assigns the odd partitions, new ones included; a shard
    with none, and a growth that can move an id to another shard, are logged as errors."""
    ingest = Ingest(ReplicaConfig(name="r", shards=2, shard=1), store, Metrics())
    consumer = FakeConsumer(high=dict.fromkeys(range(4), 0))
    with capture_logs() as logs:
        assert ingest.assign_new(consumer) is True
        assert sorted(consumer.assigned) == [1, 3]
        consumer.high |= dict.fromkeys(range(4, 8), 0)  # 4 -> 8: safe
        ingest.assign_new(consumer)
        assert sorted(consumer.assigned) == [1, 3, 5, 7]
        assert [e for e in logs if e["log_level"] == "error"] == []
        consumer.high |= dict.fromkeys(range(8, 10), 0)  # 8 -> 10: 10 is no multiple of 8
        ingest.assign_new(consumer)
    assert sorted(consumer.assigned) == [1, 3, 5, 7, 9]
    [growth] = [e for e in logs if e["event"] == "ingest.unsafe_partition_growth"]
    assert (growth["before"], growth["after"]) == (8, 10)

    lonely = Ingest(ReplicaConfig(name="r", shards=3, shard=2), store, Metrics())
    with capture_logs() as logs:
        lonely.assign_new(FakeConsumer(high={0: 0, 1: 0}))
    assert [e["setting"] for e in logs if e["event"] == "ingest.shard_owns_no_partition"] == [
        "shards"
    ]
