"""Buffer keys derived from an idempotent producer (proxy/routing/buffer_keys.py): a retry (the same
record at the same sequence) gets the same key; a record with any other content, at the same
(producer id, epoch, partition, sequence) after a sequence wrap or through a proxy that forgot
the producer, gets another."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from kdelay import headers as h
from kdelay.proxy.routing.buffer_keys import BatchKeys, Origin, buffer_key, content
from kdelay.proxy.routing.route import Incoming, route

NOW = 1_700_000_000_000
POLICY = h.DelayPolicy()
NAMESPACE = uuid.UUID("6b64656c-6179-4b65-8b79-000000000002")

maybe_bytes = st.none() | st.binary(max_size=12)
header_lists = st.lists(st.tuples(st.text(max_size=6), maybe_bytes), max_size=4)
records = st.builds(
    Incoming,
    key=maybe_bytes,
    value=maybe_bytes,
    headers=header_lists,
    timestamp=st.none() | st.integers(-1, 2**63 - 1),
)


def spec_content(r: Incoming) -> bytes:
    """The encoding as buffer_keys.content's docstring states it, written out again."""

    def blob(b: bytes | None) -> bytes:
        return b"-" if b is None else str(len(b)).encode() + b":" + b

    out = b"-" if r.timestamp is None else str(r.timestamp).encode() + b";"
    out += blob(r.key) + blob(r.value) + str(len(r.headers)).encode() + b";"
    for name, value in r.headers:
        out += blob(name.encode("utf-8", "surrogatepass")) + blob(value)
    return out


@given(
    st.builds(
        Origin, st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1)
    ),
    st.text(min_size=1, max_size=249),
    st.integers(0, 2**31 - 1),
    records,
)
def test_derived_keys_are_the_uuid5_of_identity_sequence_and_content(
    origin: Origin, topic: str, partition: int, record: Incoming
) -> None:
    """Keys are persisted and compared across proxies (and versions: a batch retried through
    an upgraded proxy must write the same keys): the derivation is uuid5 (SHA-1 of the
    namespace and the name, version 5, RFC 4122 variant) of the documented name, exactly."""
    pid, epoch, seq = origin.producer_id, origin.epoch, origin.base_sequence
    name = f"{pid}/{epoch}/{topic}/{partition}/{seq}/".encode() + spec_content(record)
    sha1 = hashlib.sha1(NAMESPACE.bytes + name, usedforsecurity=False)
    want = uuid.UUID(bytes=sha1.digest()[:16], version=5)
    assert content(record) == spec_content(record)
    assert buffer_key(origin, topic, partition, 0, record) == want.hex


@given(records, records)
def test_the_content_encoding_tells_every_two_records_apart(a: Incoming, b: Incoming) -> None:
    assert (content(a) == content(b)) == (a == b)


def _changes(r: Incoming) -> list[Incoming]:
    """``r`` with one thing changed, each way a record can differ from a retry of it."""
    first, *rest = r.headers
    name, value = first
    return [
        replace(r, key=None),
        replace(r, key=b""),
        replace(r, value=b"other"),
        replace(r, value=None),
        replace(r, timestamp=(r.timestamp or 0) + 1),
        replace(r, timestamp=None),
        replace(r, headers=[(name, None if value is not None else b""), *rest]),
        replace(r, headers=[(name + "x", value), *rest]),
        replace(r, headers=[*rest, first]),  # the same headers in another order
        replace(r, headers=[first, *rest, ("more", None)]),
    ]


def test_a_retry_gets_its_key_again_and_any_other_record_at_its_sequence_another() -> None:
    record = Incoming(
        b"k", b"v", [(h.DELAY_MS, b"10"), ("trace", None), ("t2", b"")], timestamp=NOW
    )
    origin = Origin(7, 0, 100)
    key = buffer_key(origin, "t", 1, 0, record)
    assert buffer_key(origin, "t", 1, 0, replace(record, headers=list(record.headers))) == key
    others = [buffer_key(origin, "t", 1, 0, other) for other in _changes(record)]
    assert key not in others
    assert len(set(others)) == len(others)


def test_across_the_sequence_wrap_only_an_identical_record_gets_the_same_key() -> None:
    """Sequence s and s + 2**31 are the same number on the wire (KIP-98): the record there is
    told from the earlier one by its content; an identical one (key, value, headers and
    timestamp) is taken for a retry, which it cannot be told from."""
    before = Incoming(b"k", b"v", [(h.DELAY_MS, b"10")], timestamp=NOW)
    keys = BatchKeys(Origin(7, 0, 2**31 - 1), "t", 1)
    wrapped = keys.key(1, replace(before, value=b"w"))  # sequence 2**31, which is 0
    assert wrapped != buffer_key(Origin(7, 0, 0), "t", 1, 0, before)
    assert keys.key(1, before) == buffer_key(Origin(7, 0, 0), "t", 1, 0, before)


def test_route_derives_each_records_key_from_its_own_content() -> None:
    """Two records of a batch alike but for their value, and the batch resent: the same keys,
    distinct ones for the two."""
    batch = [
        Incoming(None, b"a", [(h.DELAY_MS, b"10")], timestamp=NOW),
        Incoming(None, b"b", [(h.DELAY_MS, b"10")], timestamp=NOW),
        Incoming(None, b"b", [(h.CANCEL, b"x")], timestamp=NOW),
    ]

    def keys(records: list[Incoming]) -> list[bytes | None]:
        out, _ = route("t", 1, records, NOW, POLICY, buffer_partitions=6, origin=Origin(7, 0, 5))
        return [o.key for o in out]

    first = keys(batch)
    assert keys(list(batch)) == first
    assert len(set(first)) == 3
    for i, record in enumerate(batch):
        assert first[i] == buffer_key(Origin(7, 0, 5), "t", 1, i, record).encode()
    changed = keys([batch[0], replace(batch[1], value=b"c"), batch[2]])
    assert changed[0] == first[0]
    assert changed[1] != first[1]
    assert changed[2] == first[2]
