"""The RocksDB store: key order, atomic offsets, same-id rules, cancel, tombstones, checkpoint."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rocksdict import WriteBatch

from kdelay.buffer import Cancel, Fate, Scheduled, Tombstone
from kdelay.checkpoint import Checkpoint
from kdelay.delay_service.errors import StoreError, UnstorableError
from kdelay.delay_service.store.cancels import WINDOW_MS
from kdelay.delay_service.store.entry import (
    _encode_parts,
    check_storable,
    decode_entry,
    due_bound,
    encode_entry,
    entry_key,
    entry_target,
    split_key,
)
from kdelay.delay_service.store.outcomes import OutcomeLog
from kdelay.delay_service.store.store import Store


def sched(msg_id: str, at: int, topic: str = "t", partition: int = 0) -> Scheduled:
    return Scheduled(msg_id, topic, partition, msg_id.encode(), b"v-" + msg_id.encode(), at)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "db")
    yield s
    s.close()


def test_keys_sort_by_due_time_then_order_then_partition_then_offset() -> None:
    keys = [entry_key(2, 0, 0), entry_key(1, 5, 9), entry_key(1, 5, 10), entry_key(1, 6, 0)]
    assert sorted(keys) == [keys[1], keys[2], keys[3], keys[0]]
    # Among equal due times the order field (acceptance order) comes before the partition.
    assert entry_key(1, 6, 0, seq=1) < entry_key(1, 0, 0, seq=2)
    assert split_key(entry_key(123, 4, 2**40)) == (123, 4, 2**40)
    assert len(entry_key(0, 0, 0)) == 28
    # Keys of stores written before the order field (20 bytes) still split and sort by due.
    old = struct.pack(">QIQ", 7, 3, 9)
    assert split_key(old) == (7, 3, 9)
    assert entry_key(6, 9, 9, 2**40) < due_bound(7) <= old < due_bound(8) < entry_key(8, 0, 0)


#: What the proxy can accept (and a Kafka record carry): ids of 1-255 bytes, any topic name,
#: any int32 partition, null or binary key and value, any due time, headers with names and values
#: of a few KB (null header values reach the store as b"": the buffer decoder makes them empty).
messages = st.builds(
    Scheduled,
    id=st.text(min_size=1, max_size=64),
    topic=st.text(min_size=1, max_size=249),
    partition=st.integers(-(2**31), 2**31 - 1),
    key=st.none() | st.binary(max_size=64),
    value=st.none() | st.binary(max_size=4096),
    deliver_at_ms=st.integers(-(2**63), 2**63 - 1),
    headers=st.lists(st.tuples(st.text(max_size=2048), st.binary(max_size=4096)), max_size=40).map(
        tuple
    ),
)


@given(messages)
@settings(deadline=None)
def test_entry_codec_round_trips(msg: Scheduled) -> None:
    encoded = encode_entry(msg)
    assert decode_entry(encoded) == msg
    assert entry_target(encoded) == (msg.topic, msg.partition)  # the scan's shortcut agrees


#: Anything at all, in range or not: series fields, lone surrogates, integers beyond 64 bits;
#: mostly ASCII and in range (the fast path), so each way out of it is also tried alone.
_texts = st.text(st.characters(codec="ascii"), max_size=8) | st.text(max_size=8)
any_messages = st.builds(
    Scheduled,
    id=_texts,
    topic=_texts,
    partition=st.integers(-(2**31), 2**31 - 1) | st.integers(-(2**33), 2**33),
    key=st.none() | st.binary(max_size=8),
    value=st.none() | st.binary(max_size=8),
    deliver_at_ms=st.integers(-(2**63), 2**63 - 1) | st.integers(-(2**65), 2**65),
    headers=st.lists(st.tuples(_texts, st.binary(max_size=4)), max_size=3).map(tuple),
    uid=_texts,
    repeat=st.none() | _texts,
    occurrence=st.integers(1, 2**32 - 1) | st.integers(-2, 2**33),
)


def _checked_encoding(msg: Scheduled) -> bytes | str:
    try:
        return b"".join(_encode_parts(msg))
    except UnstorableError as exc:
        return str(exc)


@given(any_messages)
@example(Scheduled("a", "t", 0, None, None, 2**63))
@example(Scheduled("a", "t", -(2**31) - 1, None, None, 0))
@example(Scheduled("a", "t", 0, None, None, 0, uid="\ud800"))
@example(Scheduled("a", "t", 0, None, None, 0, repeat="R2/PT1S", occurrence=0))
@example(Scheduled("a", "t", 0, None, None, 0, repeat="R2/PT1S", occurrence=2**32))
@settings(deadline=None, max_examples=500)
def test_the_fast_encoder_and_check_agree_with_the_checked_encoder(msg: Scheduled) -> None:
    """encode_entry and check_storable settle the common case without naming fields (ingest's
    hot path); whatever they say must be what the field-by-field encoder says."""
    want = _checked_encoding(msg)
    if isinstance(want, bytes):
        check_storable(msg)
        assert encode_entry(msg) == want
    else:
        with pytest.raises(UnstorableError) as raised:
            check_storable(msg)
        assert str(raised.value) == want
        with pytest.raises(UnstorableError) as raised:
            encode_entry(msg)
        assert str(raised.value) == want


@given(
    count=st.integers(0, 100_000),
    name=st.text(max_size=8),
    value=st.binary(max_size=8),
    key=st.none() | st.binary(max_size=8),
)
@example(count=65_536, name="", value=b"", key=None)  # the poison record
@example(count=65_535, name="h", value=b"v", key=b"k")
@settings(max_examples=15, deadline=None)
def test_any_header_count_a_kafka_record_carries_round_trips(
    count: int, name: str, value: bytes, key: bytes | None
) -> None:
    msg = Scheduled("id", "t", 0, key, None, 1, ((name, value),) * count)
    check_storable(msg)
    assert decode_entry(encode_entry(msg)) == msg


def test_entries_of_format_version_1_still_decode() -> None:
    """Stores written before the header count was widened open and read as before."""
    msg = Scheduled("a", "t", 3, None, b"v", 42, (("h", b"x"), ("", b"")))
    fields = [b"a", b"t", None, b"v", b"h", b"x", b"", b""]
    body = b"".join(
        struct.pack("<I", 0xFFFFFFFF) if f is None else struct.pack("<I", len(f)) + f
        for f in fields
    )
    v1 = struct.pack("<BqiH", 1, 42, 3, 2) + body
    assert decode_entry(v1) == msg
    assert encode_entry(msg)[0] == 3  # written as version 3 from now on (with the buffer key)
    v2 = struct.pack("<BqiI", 2, 42, 3, 2) + body
    assert decode_entry(v2) == msg
    assert entry_target(v1) == entry_target(v2) == ("t", 3)


@pytest.mark.parametrize(
    ("msg", "named"),
    [
        (Scheduled("a", "t", 0, None, None, 2**63), "due time"),
        (Scheduled("a", "t", 2**31, None, None, 1), "partition"),
        (Scheduled("a", "\ud800", 0, None, None, 1), "topic"),
        (Scheduled("\udfff", "t", 0, None, None, 1), "id"),
        (Scheduled("a", "t", 0, None, None, 1, (("\ud800", b""),)), "header 0 name"),
    ],
)
def test_what_the_format_cannot_hold_is_named_not_a_codec_crash(msg: Scheduled, named: str) -> None:
    with pytest.raises(UnstorableError, match=named):
        check_storable(msg)
    with pytest.raises(UnstorableError, match=named):
        encode_entry(msg)


def test_entry_codec_rejects_unknown_versions_and_garbage() -> None:
    with pytest.raises(StoreError, match="version"):
        decode_entry(b"\x07rest")
    with pytest.raises(StoreError, match="version"):
        decode_entry(b"")
    with pytest.raises(StoreError):
        decode_entry(encode_entry(sched("a", 1))[:-3])
    with pytest.raises(StoreError, match="after the last field"):
        decode_entry(encode_entry(sched("a", 1)) + b"x")
    with pytest.raises(StoreError, match="version"):
        entry_target(b"\x07rest")  # what the shortcut cannot read, decode_entry names
    with pytest.raises(StoreError, match=r"truncated|corrupt"):
        entry_target(encode_entry(sched("a", 1))[:12])


def test_due_returns_entries_in_key_order_up_to_now(store: Store) -> None:
    store.apply(
        [(0, 0, sched("c", 300)), (1, 0, sched("a", 100)), (0, 1, sched("b", 100))],
        {0: 2, 1: 1},
    )
    due = store.due(200, limit=100)
    assert [(e.message.id, e.partition, e.offset) for e in due] == [("b", 0, 1), ("a", 1, 0)]
    assert [e.message.id for e in store.due(300, limit=100)] == ["b", "a", "c"]
    assert [e.message.id for e in store.due(300, limit=1)] == ["b"]
    assert store.pending == 3
    assert store.next_due_ms() == 100
    assert store.next_due_ms(after_ms=100) == 300


def test_offsets_persist_with_entries_across_reopen(tmp_path: Path) -> None:
    s = Store(tmp_path / "db")
    s.apply([(0, 0, sched("a", 5)), (3, 7, sched("b", 6))], {0: 1, 3: 8})
    s.close()
    s = Store(tmp_path / "db")
    try:
        assert s.offsets() == {0: 1, 3: 8}
        assert s.pending == 2
        assert [e.message.id for e in s.due(10, 10)] == ["a", "b"]
    finally:
        s.close()
    with pytest.raises(StoreError, match="closed"):
        s.due(10, 10)


def test_offsets_never_move_backwards(store: Store) -> None:
    store.apply([], {0: 10})
    store.apply([], {0: 4})
    assert store.offsets() == {0: 10}


def test_same_id_keeps_the_first_and_counts_duplicates(store: Store) -> None:
    r1 = store.apply([(0, 0, sched("x", 100)), (0, 1, sched("x", 50))], {0: 2})
    r2 = store.apply([(0, 2, sched("x", 10))], {0: 3})
    assert (r1.scheduled, r1.duplicates, r2.duplicates) == (1, 1, 1)
    entry = store.get("x")
    assert entry is not None
    assert (entry.offset, entry.message.deliver_at_ms) == (0, 100)
    assert store.pending == 1


def test_cancel_removes_the_pending_entry_and_reports_it(store: Store) -> None:
    store.apply([(2, 5, sched("x", 100))], {2: 6})
    result = store.apply([(2, 6, Cancel("x")), (2, 7, Cancel("unknown"))], {2: 8})
    assert result.cancelled == 1
    assert [r[:4] for r in result.retired] == [("x", "", 2, 5)]
    assert store.get("x") is None
    assert store.pending == 0
    assert store.due(1000, 10) == []


def test_cancel_and_reschedule_in_one_batch(store: Store) -> None:
    result = store.apply([(0, 0, sched("x", 1)), (0, 1, Cancel("x")), (0, 2, sched("x", 2))], {})
    assert [r[:4] for r in result.retired] == [("x", "", 0, 0)]
    entry = store.get("x")
    assert entry is not None
    assert entry.offset == 2
    assert store.pending == 1


def test_a_reused_id_with_a_new_buffer_key_is_a_second_message(store: Store) -> None:
    a = dataclasses.replace(sched("x", 100), uid="a" * 32)
    b = dataclasses.replace(sched("x", 200), uid="b" * 32)
    result = store.apply([(0, 0, a), (0, 1, b)], {0: 2})
    assert (result.scheduled, result.duplicates, store.pending) == (2, 0, 2)
    # The same record read again (a producer's retry through another proxy) is a duplicate.
    again = store.apply([(0, 2, dataclasses.replace(b, deliver_at_ms=300))], {0: 3})
    assert (again.scheduled, again.duplicates, store.pending) == (0, 1, 2)
    due = store.due(1000, 10)
    assert [(e.message.uid[0], e.offset) for e in due] == [("a", 0), ("b", 1)]
    # Delivering A (tombstone by its buffer key) leaves B.
    store.apply([(0, 3, Tombstone("x", 0, "a" * 32))], {0: 4})
    assert [e.offset for e in store.due(1000, 10)] == [1]


def test_a_cancel_removes_every_earlier_message_with_its_id_and_retires_itself(
    store: Store,
) -> None:
    a = dataclasses.replace(sched("x", 100), uid="a" * 32)
    b = dataclasses.replace(sched("x", 200), uid="b" * 32)
    other = dataclasses.replace(sched("xy", 100), uid="c" * 32)
    store.apply([(1, 0, a), (1, 1, b), (1, 2, other)], {1: 3})
    result = store.apply([(1, 3, Cancel("x", "d" * 32), 1_000)], {1: 4})
    assert result.cancelled == 2
    assert sorted(r[:4] for r in result.retired) == [
        ("x", "a" * 32, 1, 0),
        ("x", "b" * 32, 1, 1),
        ("x", "d" * 32, 1, 3),
    ]
    later = dataclasses.replace(sched("x", 300), uid="e" * 32)  # no acceptance time: new
    store.apply([(1, 4, later, 2_000)], {1: 5})
    assert sorted(e.message.uid[0] for e in store.due(1000, 10)) == ["c", "e"]
    # Retired already: its window closes with nothing more owed.
    closing = store.apply([(1, 5, Cancel("other", "f" * 32), 1_000 + WINDOW_MS + 1)], {1: 6})
    assert [r[:4] for r in closing.retired] == []


def test_equal_due_times_leave_in_acceptance_order(store: Store) -> None:
    # Four messages due at the same millisecond, accepted in the order s = 1..4, spread over
    # buffer partitions whose numbers run the other way.
    records = [(4 - s, 0, dataclasses.replace(sched(f"m{s}", 50), seq=s)) for s in (1, 2, 3, 4)]
    store.apply(records, dict.fromkeys(range(4), 1))
    assert [e.message.id for e in store.due(50, 10)] == ["m1", "m2", "m3", "m4"]


def test_tombstone_deletes_only_the_matching_offset(store: Store) -> None:
    store.apply([(0, 3, sched("x", 1))], {0: 4})
    store.apply([(0, 4, Tombstone("x", 2))], {0: 5})  # an older use of the id
    assert store.get("x") is not None
    result = store.apply([(0, 5, Tombstone("x", 3))], {0: 6})
    assert result.tombstoned == 1
    assert store.get("x") is None
    assert store.pending == 0


def test_invalid_records_are_counted_and_offsets_still_advance(store: Store) -> None:
    result = store.apply([(0, 0, None), (0, 1, None)], {0: 2})
    assert result.invalid == 2
    assert store.offsets() == {0: 2}


def test_remove_skips_entries_a_cancel_already_removed(store: Store) -> None:
    store.apply([(0, 0, sched("a", 1)), (0, 1, sched("b", 2))], {0: 2})
    due = store.due(10, 10)
    store.apply([(0, 2, Cancel("a"))], {0: 3})
    assert store.remove(due) == 1
    assert store.pending == 0


def test_checkpoint_drops_covered_entries_and_filters_later_ingest(store: Store) -> None:
    store.apply(
        [(0, 0, sched("a", 10)), (0, 1, sched("b", 20)), (0, 5, sched("late", 5))],
        {0: 6},
    )
    # Covers offsets < 2 due by 15: only "a"; "late" (offset 5) is beyond O.
    assert store.apply_checkpoint(Checkpoint(15, {0: 2})) == 1
    assert [e.message.id for e in store.due(100, 10)] == ["late", "b"]
    # A replica re-reading the topic skips what the checkpoint covers.
    result = store.apply([(1, 0, sched("c", 1))], {1: 1})
    assert result.scheduled == 1
    store.apply_checkpoint(Checkpoint(30, {0: 6, 1: 1}))
    result = store.apply([(0, 0, sched("a", 10)), (0, 7, sched("d", 10))], {0: 8})
    assert (result.covered, result.scheduled) == (1, 1)
    assert [e.message.id for e in store.due(100, 10)] == ["d"]
    assert store.pending == 1
    assert store.checkpoint.time_ms == 30


def test_pending_count_is_maintained_not_scanned(tmp_path: Path) -> None:
    s = Store(tmp_path / "db")
    s.apply([(0, i, sched(f"m{i}", i)) for i in range(50)], {0: 50})
    s.remove(s.due(19, 100))
    s.close()
    s = Store(tmp_path / "db")
    try:
        assert s.pending == 30
        assert len(s.due(10_000, 1000)) == 30
    finally:
        s.close()


def test_late_arrival_lowers_the_floor(store: Store) -> None:
    store.apply([(0, 0, sched("a", 100))], {0: 1})
    store.remove(store.due(100, 10))
    store.apply([(0, 1, sched("b", 200))], {0: 2})
    assert store.due(150, 10) == []  # floor moved past 100
    store.apply([(0, 2, sched("early", 50))], {0: 3})
    assert [e.message.id for e in store.due(150, 10)] == ["early"]


def test_a_claim_behind_the_scan_keeps_the_floor(store: Store) -> None:
    """A burst due in one millisecond is released in rounds cut short among its entries, and
    each round's claim is the millisecond before (``round.claim_ms``). Applying that claim must
    not move the floor back below the round just removed: every later scan would seek over all
    the deletions since, a cost that grew with each round (a 200,000 burst: 1.3 s of seeks).
    Read through ``Store.floor``: nothing else tells a scan that skips deletions apart."""
    n = 30
    store.apply([(0, i, sched(f"m{i}", 100)) for i in range(n)], {0: n})
    released: list[str] = []
    for _ in range(3):
        scan = store.due(100, 10)
        floor = store.floor
        store.remove(scan)
        store.apply_checkpoint(Checkpoint(99, {0: n}))  # the round was cut at due time 100
        assert store.floor >= floor
        released += [e.message.id for e in scan]
    assert released == [f"m{i}" for i in range(n)]
    assert store.due(100, 10) == []
    assert store.pending == 0
    store.apply([(0, n, sched("late", 50))], {0: n + 1})  # a later, earlier-due arrival
    assert [e.message.id for e in store.due(100, 10)] == ["late"]


def test_scan_after_many_deletions_sees_only_live_entries(store: Store) -> None:
    n = 20_000
    store.apply([(0, i, sched(f"m{i}", i)) for i in range(n)], {0: n})
    for start in range(0, n, 5000):
        store.remove(store.due(start + 4999, 5000))
    store.apply([(0, n, sched("last", n + 1))], {0: n + 1})
    assert [e.message.id for e in store.due(n + 5, 10)] == ["last"]
    assert store.pending == 1


def test_a_scan_resumes_a_pass_where_the_last_one_stopped(store: Store) -> None:
    """``start``: the scan begins there, not at the floor; what lies below counts as passed over
    (the claim stays below it), and a start at or below the first entry is a scan from the
    floor."""
    store.apply([(0, i, sched(f"x{i}", 100 + i, topic="x")) for i in range(12)], {0: 12})
    store.apply([(1, i, sched(f"y{i}", 200 + i, topic="y")) for i in range(2)], {1: 2})
    first = store.due_skipping(1_000, 10, {("x", 0)}, 5)
    assert (first.entries, first.skipped, first.truncated) == ([], 5, True)
    assert (first.passed, first.first_skipped_ms, first.last_ms) == (
        frozenset({("x", 0)}),
        100,
        104,
    )
    assert first.stopped_at is not None
    assert split_key(first.stopped_at) == (104, 0, 4)
    second = store.due_skipping(1_000, 10, {("x", 0)}, 5, start=first.stopped_at + b"\0")
    assert (second.skipped, second.truncated) == (5, True)
    assert (second.first_skipped_ms, second.last_ms) == (100, 109)  # x0 is still pending
    assert second.stopped_at is not None
    third = store.due_skipping(1_000, 10, {("x", 0)}, 5, start=second.stopped_at + b"\0")
    assert [e.message.id for e in third.entries] == ["y0", "y1"]
    assert (third.skipped, third.truncated, third.stopped_at) == (2, False, None)
    assert third.first_skipped_ms == 100
    # Nothing below the start: the same as a scan from the floor.
    again = store.due_skipping(1_000, 10, set(), 5, start=due_bound(0))
    assert (len(again.entries), again.first_skipped_ms) == (10, None)


def test_a_scan_keeps_its_upper_bound_alive(store: Store) -> None:
    """rocksdict 0.3 frees an iterator's upper bound with its ReadOptions object: a scan that
    let that object go stopped wherever the reused memory sorted (here after 1 entry of 53)."""
    store.apply([(0, 0, sched("x0", 100, topic="x"))], {0: 1})
    assert [e.message.id for e in store.due(2**62, 100)] == ["x0"]
    store.apply([(0, i, sched(f"x{i}", 100 + i, topic="x")) for i in range(1, 50)], {0: 50})
    store.apply([(1, i, sched(f"y{i}", 200 + i, topic="y")) for i in range(3)], {1: 3})
    for _ in range(5):
        assert len(store.due_skipping(1_000_000, 100, set(), 100).entries) == 53
        assert len(store.due(1_000_000, 100)) == 53
        assert store.count_due_within(1_000_000, [0], 100) == [53]


def test_due_window_counts_are_cumulative(store: Store) -> None:
    store.apply([(0, i, sched(f"m{i}", at)) for i, at in enumerate([5, 50, 500])], {0: 3})
    assert store.count_due_within(0, [10, 100, 1000], cap=100) == [1, 2, 3]
    assert store.count_due_within(0, [10, 100, 1000], cap=2) == [1, 2, 2]


@settings(max_examples=40, deadline=None)
@given(
    dues=st.lists(st.integers(0, 2_000), max_size=60),
    windows=st.lists(st.integers(0, 2_000), min_size=1, max_size=6),
    now=st.integers(0, 1_000),
    cap=st.integers(0, 70),
)
def test_due_window_counts_match_a_count_of_every_entry(
    tmp_path_factory: pytest.TempPathFactory,
    dues: list[int],
    windows: list[int],
    now: int,
    cap: int,
) -> None:
    """The one-pass count equals counting each of the first ``cap`` entries (in due order)
    into every window it is due within, windows in any order, overdue entries included."""
    s = Store(tmp_path_factory.mktemp("due") / "db")
    try:
        s.apply([(0, i, sched(f"m{i}", at)) for i, at in enumerate(dues)], {0: len(dues)})
        first = sorted(dues)[:cap]
        expected = [sum(1 for at in first if at <= now + w) for w in windows]
        assert s.count_due_within(now, windows, cap) == expected
    finally:
        s.close()


def test_size_bytes_counts_the_write_ahead_log_and_the_tables(tmp_path: Path) -> None:
    s = Store(tmp_path / "db")
    empty = s.size_bytes()
    payload = 100 * 1000  # 100 entries with 1000-byte values
    s.apply(
        [(0, i, Scheduled(f"m{i}", "t", 0, None, bytes(1000), i)) for i in range(100)], {0: 100}
    )
    written = s.size_bytes()
    assert written >= empty + payload  # every value is in the write-ahead log
    s.close()
    s = Store(tmp_path / "db")  # closing flushed the memtables into table (.sst) files
    try:
        tables = sum(p.stat().st_size for p in (tmp_path / "db").glob("*.sst"))
        assert tables > 0
        assert s.size_bytes() >= tables
    finally:
        s.close()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["schedule", "cancel", "tomb"]), st.sampled_from("abcde")),
        max_size=40,
    )
)
def test_store_agrees_with_a_model(tmp_path_factory: pytest.TempPathFactory, ops: list) -> None:  # type: ignore[type-arg]
    s = Store(tmp_path_factory.mktemp("model"))
    model: dict[str, int] = {}  # id -> offset of its pending entry
    try:
        for offset, (op, msg_id) in enumerate(ops):
            if op == "schedule":
                s.apply([(0, offset, sched(msg_id, offset))], {0: offset + 1})
                model.setdefault(msg_id, offset)
            elif op == "cancel":
                s.apply([(0, offset, Cancel(msg_id))], {0: offset + 1})
                model.pop(msg_id, None)
            else:
                target = model.get(msg_id, offset)
                s.apply([(0, offset, Tombstone(msg_id, target))], {0: offset + 1})
                model.pop(msg_id, None)
        assert s.pending == len(model)
        assert {e.message.id: e.offset for e in s.due(10_000, 1000)} == model
    finally:
        s.close()


def test_initial_checkpoint_claim_of_nothing_persists(tmp_path: Path) -> None:
    s = Store(tmp_path / "db")
    s.apply([(0, 0, sched("a", 1))], {0: 1})
    assert s.apply_checkpoint(Checkpoint(-1, {})) == 0
    s.close()
    s = Store(tmp_path / "db")
    try:
        assert s.checkpoint.time_ms == -1
        assert s.pending == 1
    finally:
        s.close()


def test_a_copy_arriving_after_its_record_was_delivered_is_a_duplicate(store: Store) -> None:
    # An idempotent producer's retry through a restarted proxy can reach the buffer after the
    # first copy was delivered: same id and buffer key, a later offset.
    first = dataclasses.replace(sched("d-1", 10), uid="k" * 32)
    store.apply([(0, 0, first)], {0: 1})
    store.remove(store.due(10, 10))
    late = store.apply([(0, 5, dataclasses.replace(first, deliver_at_ms=40))], {0: 6})
    assert (late.scheduled, late.duplicates, store.pending) == (0, 1, 0)
    # Covered by a checkpoint on a follower: the same.
    other = dataclasses.replace(sched("d-2", 10), uid="m" * 32)
    store.apply([(1, 0, other)], {1: 1})
    store.apply_checkpoint(Checkpoint(10, {1: 1}))
    assert store.apply([(1, 3, other)], {1: 4}).duplicates == 1
    # A new message reusing the id (another buffer key) is not a copy.
    reuse = dataclasses.replace(first, uid="n" * 32)
    assert store.apply([(0, 7, reuse)], {0: 8}).scheduled == 1


def _source(store: Store, msg_id: str) -> str | None:
    outcome = store.outcome(msg_id)
    return None if outcome is None else outcome.source


def _delivered(at: int) -> Fate:
    return Fate("delivered", "t", 0, 7, at + 1, at, None)


def test_the_masters_own_tombstone_is_skipped_a_foreign_one_applied(tmp_path: Path) -> None:
    # The master removed "a" with its outcome; reading its own tombstone back has nothing to
    # learn (no lookup, no second outcome write). A tombstone it did not write is applied.
    learnt: list[str] = []

    class LearningLog(OutcomeLog):
        """The outcome log, noting each id it learns an outcome of."""

        def learn(
            self, batch: WriteBatch, msg_id: str, fate: Fate, source: str, now_ms: int
        ) -> None:
            learnt.append(msg_id)
            super().learn(batch, msg_id, fate, source, now_ms)

    store = Store(tmp_path / "db", outcome_log=LearningLog)
    try:
        store.apply([(0, 0, sched("a", 1)), (0, 1, sched("b", 2))], {0: 2})
        a = store.due(10, 10)[0]
        assert store.remove([a], {a.key: _delivered(1)}) == 1
        result = store.apply(
            [
                (0, 2, Tombstone("a", 0, fate=_delivered(1))),
                (0, 3, Tombstone("b", 1, fate=_delivered(2))),
            ],
            {0: 4},
        )
        assert learnt == ["b"]
        assert result.tombstoned == 1
        assert store.pending == 0
        assert _source(store, "a") == "master"
        assert _source(store, "b") == "tombstone"
    finally:
        store.close()


def test_the_memory_of_own_releases_is_bounded(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kdelay.delay_service.store.writes.RELEASED_MEMORY", 2)
    store.apply([(0, i, sched(f"m{i}", i + 1)) for i in range(4)], {0: 4})
    due = store.due(10, 10)
    store.remove(due, {e.key: _delivered(e.message.deliver_at_ms) for e in due})
    assert store.unread_releases == 2  # the two newest
    # A forgotten one is applied the long way: learnt again, the master's outcome kept.
    store.apply([(0, 4, Tombstone("m0", 0, fate=_delivered(1)))], {0: 5})
    assert _source(store, "m0") == "master"
