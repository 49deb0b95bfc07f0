"""The buffer-record contract (kdelay/buffer/): round trips, properties and bad inputs."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.buffer import (
    BUFFER_TOPIC,
    ROUTE_HEADER,
    BufferRecord,
    Cancel,
    Fate,
    Scheduled,
    Tombstone,
    decode,
    encode,
    partition_for,
    pinned_id,
)
from kdelay.errors import BufferFormatError

ids = st.text(min_size=1, max_size=40)
uids = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
header_names = st.text(max_size=20).filter(lambda n: n != ROUTE_HEADER)
headers = st.lists(st.tuples(header_names, st.binary(max_size=30)), max_size=6).map(tuple)
scheduled = st.builds(
    Scheduled,
    id=ids,
    topic=st.text(min_size=1, max_size=30),
    partition=st.integers(min_value=-1, max_value=10_000),
    key=st.none() | st.binary(max_size=50),
    value=st.none() | st.binary(max_size=200),
    deliver_at_ms=st.integers(min_value=0, max_value=2**62),
    headers=headers,
    uid=uids,
    seq=st.integers(min_value=0, max_value=2**62),
)
longs = st.none() | st.integers(min_value=0, max_value=2**62)
fates = st.none() | st.builds(
    Fate,
    state=st.sampled_from(["delivered", "dead_lettered", "cancelled"]),
    topic=st.none() | st.text(min_size=1, max_size=20),
    partition=st.none() | st.integers(min_value=0, max_value=2**31 - 1),
    offset=longs,
    released_ms=longs,
    deliver_at_ms=longs,
    occurrence=st.none() | st.integers(min_value=1, max_value=2**31),
)
records: st.SearchStrategy[BufferRecord] = (
    scheduled
    | st.builds(Cancel, id=ids, uid=uids)
    | st.builds(
        Tombstone, id=ids, offset=st.integers(min_value=0, max_value=2**62), uid=uids, fate=fates
    )
)


def roundtrip(record: BufferRecord) -> BufferRecord:
    enc = encode(record)
    # Kafka hands headers back as a list of (str, bytes) pairs.
    return decode(enc.key, enc.value, [(n, v) for n, v in enc.headers])


@given(records)
def test_every_record_survives_a_round_trip(record: BufferRecord) -> None:
    assert roundtrip(record) == record


@given(scheduled)
def test_route_header_is_last_and_value_is_never_a_compaction_tombstone(msg: Scheduled) -> None:
    enc = encode(msg)
    assert enc.headers[-1][0] == ROUTE_HEADER
    assert enc.value is not None  # a null value would be compacted away
    assert enc.key == msg.uid.encode()


@given(scheduled, st.integers(min_value=0, max_value=2**40), st.integers(0, 2**40))
def test_a_relative_delay_counts_from_the_record_timestamp(
    msg: Scheduled, delay: int, appended: int
) -> None:
    enc = encode(dataclasses.replace(msg, delay_ms=delay, deliver_at_ms=-1))
    back = decode(enc.key, enc.value, list(enc.headers), appended)
    assert back == dataclasses.replace(msg, delay_ms=delay, deliver_at_ms=appended + delay)
    with pytest.raises(BufferFormatError, match="needs the record's timestamp"):
        decode(enc.key, enc.value, list(enc.headers))


def test_format_1_records_are_still_read() -> None:
    route = {"v": 1, "op": "schedule", "t": "t", "p": 2, "k": None, "d": 5, "n": False}
    back = decode(b"old-id", b"v", [(ROUTE_HEADER, json.dumps(route).encode())])
    assert back == Scheduled("old-id", "t", 2, None, b"v", 5)
    assert back.buffer_key == "old-id"
    assert decode(b"old-id", b"", _route(v=1, op="cancel")) == Cancel("old-id")
    assert decode(b"old-id", None, _route(v=1, op="done", o=4)) == Tombstone("old-id", 4)


def test_every_record_about_an_id_goes_to_one_partition() -> None:
    assert partition_for("order-1", 6) == partition_for("order-1", 6)
    spread = {partition_for(f"order-{i}", 6) for i in range(200)}
    assert spread == set(range(6))
    # Kafka's murmur2 (the Java client's default partitioner) on the id as a key.
    assert partition_for("abc", 2**31 - 1) == 479470107
    # An id the proxy pinned to a partition (a message sent without kdelay-id).
    assert partition_for("b4." + "0" * 32, 6) == 4
    pinned = pinned_id("a" * 32, "t", 3, 6)
    assert partition_for(pinned, 6) == partition_for("t/3", 6)


@pytest.mark.parametrize(
    ("key", "value"),
    [(None, None), (b"", b""), (None, b""), (b"", None), (b"k", b"v")],
)
def test_null_and_empty_key_and_value_stay_distinct(key: bytes | None, value: bytes | None) -> None:
    msg = Scheduled("id-1", "t", 3, key, value, 1_700_000_000_000, uid="u")
    back = roundtrip(msg)
    assert isinstance(back, Scheduled)
    assert back.key == key
    assert back.value == value


def test_unicode_ids_and_headers() -> None:
    msg = Scheduled(
        "ключ-🔑-鍵", "topic.ü", -1, b"k", b"v", 5, (("hé", b"\xff\x00"), ("", b"")), uid="u"
    )
    assert roundtrip(msg) == msg


def test_cancel_and_tombstone() -> None:
    assert roundtrip(Cancel("x", "c1")) == Cancel("x", "c1")
    tomb = encode(Tombstone("x", 42, "u1"))
    assert tomb.value is None  # compaction removes the record keyed u1
    assert tomb.key == b"u1"
    assert decode(tomb.key, tomb.value, list(tomb.headers)) == Tombstone("x", 42, "u1")


def test_delivered_headers_add_id_and_due_time() -> None:
    msg = Scheduled("abc", "t", 0, None, b"v", 1234, (("a", b"1"),))
    assert msg.delivered_headers() == [
        ("a", b"1"),
        ("kdelay-id", b"abc"),
        ("kdelay-deliver-at", b"1234"),
    ]


def test_null_header_value_decodes_as_null() -> None:
    enc = encode(Scheduled("a", "t", 0, None, b"", 1))
    back = decode(enc.key, enc.value, [("own", None), *enc.headers])
    assert isinstance(back, Scheduled)
    assert back.headers == (("own", None),)


def _route(**obj: object) -> list[tuple[str, bytes | None]]:
    return [(ROUTE_HEADER, json.dumps(obj).encode())]


@pytest.mark.parametrize(
    ("key", "value", "hdrs", "why"),
    [
        (None, b"", _route(v=1, op="cancel"), "no key"),
        (b"", b"", _route(v=1, op="cancel"), "no key"),
        (b"\xff\xfe", b"", _route(v=1, op="cancel"), "not UTF-8"),
        (b"id", b"", None, "lacks a trailing"),
        (b"id", b"", [], "lacks a trailing"),
        (b"id", b"", [*_route(v=1, op="cancel"), ("x", b"1")], "lacks a trailing"),
        (b"id", b"", [(ROUTE_HEADER, None)], "lacks a trailing"),
        (b"id", b"", [(ROUTE_HEADER, b"{not json")], "bad kdelay-route"),
        (b"id", b"", [(ROUTE_HEADER, b"[1]")], "not an object"),
        (b"id", b"", _route(v=3, op="cancel", i="x"), "version 3"),
        (b"id", b"", _route(v=2, op="cancel"), "bad kdelay-route"),
        (b"id", b"", _route(op="cancel"), "version None"),
        (b"id", b"", _route(v=1, op="explode"), "unknown op"),
        (b"id", b"", _route(v=1), "bad kdelay-route"),
        (b"id", b"", _route(v=1, op="schedule", t="t", p=0, k="!!", d=1, n=False), "bad"),
        (b"id", b"", _route(v=1, op="schedule", t="t", p="x", k=None, d=1, n=False), "bad"),
        (b"id", b"", _route(v=1, op="schedule", t="t", p=0, k=None, n=False), "bad"),
        (b"id", None, _route(v=1, op="done"), "bad"),
        (b"id", None, _route(v=1, op="done", o="zz"), "bad"),
    ],
)
def test_bad_inputs_raise_buffer_format_error(
    key: bytes | None, value: bytes | None, hdrs: list[tuple[str, bytes | None]] | None, why: str
) -> None:
    with pytest.raises(BufferFormatError, match=why):
        decode(key, value, hdrs)


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_garbage_route_never_escapes_as_another_exception(key: bytes, route: bytes) -> None:
    with contextlib.suppress(BufferFormatError):
        decode(key, b"", [(ROUTE_HEADER, route)])


def test_topic_names() -> None:
    assert BUFFER_TOPIC == "__kdelay_buffer"


@pytest.mark.parametrize(
    "route",
    [
        b"[" * 100_000,  # nesting deeper than the JSON parser's recursion limit
        b'{"v":1,"op":"schedule","t":"t","p":1e400,"k":null,"d":1,"n":false}',  # infinity
        b'{"v":1,"op":"done","o":NaN}',
    ],
)
def test_pathological_routes_are_format_errors(route: bytes) -> None:
    with pytest.raises(BufferFormatError):
        decode(b"id", b"", [(ROUTE_HEADER, route)])


def test_a_null_header_value_stays_null_from_the_proxy_to_the_store() -> None:
    """Kafka tells a null header value from an empty one; so does the delivered record
    (null values were delivered as empty)."""
    from kdelay.delay_service.store.entry import decode_entry, encode_entry
    from kdelay.headers import strip_control

    own = strip_control([("null", None), ("empty", b""), ("kdelay-delay-ms", b"5"), ("x", b"1")])
    assert own == (("null", None), ("empty", b""), ("x", b"1"))
    msg = Scheduled("n-1", "t", 0, None, b"v", 1_000, own)
    enc = encode(msg)
    back = decode(enc.key, enc.value, enc.headers)
    assert isinstance(back, Scheduled)
    assert back.headers == own
    assert decode_entry(encode_entry(back)).headers == own
    assert back.delivered_headers()[:3] == list(own)
