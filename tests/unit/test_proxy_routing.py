"""Per-record routing (CONTRACT.md) with in-process fakes: through, buffered, cancelled."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay import buffer
from kdelay import headers as h
from kdelay.errors import InvalidHeaderError
from kdelay.proxy.routing import internal_topics
from kdelay.proxy.routing.buffer_keys import Origin, buffer_key, content
from kdelay.proxy.routing.internal_topics import RefusedTopicError
from kdelay.proxy.routing.route import (
    BufferUnavailableError,
    Incoming,
    Kind,
    Outgoing,
    RejectedRecordError,
    route,
)

NOW = 1_700_000_000_000
POLICY = h.DelayPolicy()
PARTITIONS = 6


def route_record(
    topic: str, partition: int, rec: Incoming, now_ms: int, policy: h.DelayPolicy
) -> Outgoing:
    """``route`` for a batch of one record; raises the InvalidHeaderError of a header at fault."""
    try:
        (out,), _ = route(topic, partition, [rec], now_ms, policy, buffer_partitions=PARTITIONS)
    except RejectedRecordError as exc:
        if exc.header_error is None:
            raise
        raise exc.header_error from None
    return out


def test_plain_record_passes_through_unchanged() -> None:
    rec = Incoming(b"k", b"v", [("a", b"1"), ("b", None)], 123)
    out = route_record("t", 2, rec, NOW, POLICY)
    assert out.kind is Kind.IMMEDIATE
    assert (out.topic, out.partition, out.key, out.value) == ("t", 2, b"k", b"v")
    assert out.headers == [("a", b"1"), ("b", None)]
    assert out.timestamp_ms == 123


@pytest.mark.parametrize("key", [None, b"", b"k"])
def test_delayed_record_becomes_a_buffer_record(key: bytes | None) -> None:
    rec = Incoming(key, None, [("a", b"1"), (h.DELAY_MS, b"1500"), (h.ID, b"m-1")])
    out = route_record("t", 3, rec, NOW, POLICY)
    assert out.kind is Kind.DELAYED
    assert (out.topic, out.partition) == (buffer.BUFFER_TOPIC, buffer.partition_for("m-1", 6))
    assert out.key is not None
    assert len(out.key) == 32  # a buffer key of its own, not the id
    appended = NOW + 7  # the broker's append time: the delay counts from it
    decoded = buffer.decode(out.key, out.value, list(out.headers), appended)
    assert isinstance(decoded, buffer.Scheduled)
    assert decoded == buffer.Scheduled(
        "m-1",
        "t",
        3,
        key,
        None,
        appended + 1500,
        (("a", b"1"),),
        uid=out.key.decode(),
        seq=decoded.seq,
        delay_ms=1500,
    )
    assert out.deliver_at_ms == NOW + 1500  # the proxy's estimate


def test_an_idempotent_batch_retried_writes_the_same_buffer_keys() -> None:
    records = [
        Incoming(None, b"a", [(h.DELAY_MS, b"10")]),
        Incoming(None, b"b", [(h.DELAY_MS, b"10"), (h.ID, b"mine")]),
        Incoming(None, b"c", [(h.CANCEL, b"mine")]),
    ]

    def keys(origin: Origin | None, topic: str = "t") -> list[tuple[bytes | None, str | None]]:
        out, _ = route(topic, 1, records, NOW, POLICY, buffer_partitions=6, origin=origin)
        return [(o.key, o.id) for o in out]

    first = keys(Origin(7, 0, 100))
    assert keys(Origin(7, 0, 100)) == first  # the same batch through another proxy
    # The derived id: the buffer key, pinned to the target partition's buffer partition.
    assert first[0][1] == buffer.pinned_id(first[0][0].decode(), "t", 1, 6)  # type: ignore[union-attr]
    assert first[1][1] == "mine"
    assert len({k for k, _ in first}) == 3
    for other in (Origin(8, 0, 100), Origin(7, 1, 100), Origin(7, 0, 103)):
        assert not set(keys(other)) & set(first)
    assert not set(keys(Origin(7, 0, 100), "u")) & set(first)
    assert keys(None) != keys(None)  # not idempotent: random keys


@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**15 - 1),
    st.text(min_size=1, max_size=249),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
)
def test_derived_buffer_keys_are_the_uuid5_of_the_producer_identity(
    pid: int, epoch: int, topic: str, partition: int, seq: int
) -> None:
    """The buffer keys of an idempotent batch are persisted and compared across proxies (and
    versions: a batch retried through an upgraded proxy must write the same keys): the
    derivation without UUID objects is uuid5, exactly (of the name, then the record's content:
    tests/unit/test_buffer_keys.py); and the pinned id of a record without one is the murmur2
    of its target partition, cached or not."""
    record = Incoming(None, b"v", [])
    key = buffer_key(Origin(pid, epoch, seq), topic, partition, 0, record)
    name = f"{pid}/{epoch}/{topic}/{partition}/{seq}/" + content(record).decode()
    assert key == uuid.uuid5(uuid.UUID("6b64656c-6179-4b65-8b79-000000000002"), name).hex
    pinned = buffer.pinned_id(key, topic, partition, 12)
    assert pinned == f"b{buffer.partition_for(f'{topic}/{partition}', 12)}.{key}"


def test_a_batchs_records_get_the_keys_of_their_own_sequence_numbers_across_the_wrap() -> None:
    """route() derives a batch's keys from a prefix shared by the batch: each record's must
    still be the uuid5 of its own sequence number, which wraps at 2**31 (KIP-98), and its own
    content."""
    origin = Origin(7, 2, 2**31 - 2)
    records = [
        Incoming(None, b"v", [(h.DELAY_MS, b"10")]),
        Incoming(None, b"v", [(h.CANCEL, b"x")]),
        Incoming(None, b"v", [(h.DELAY_MS, b"10"), (h.ID, b"y")]),
        Incoming(None, b"v", []),
    ]
    out, _ = route("t", 3, records, NOW, POLICY, buffer_partitions=6, origin=origin)
    namespace = uuid.UUID("6b64656c-6179-4b65-8b79-000000000002")
    for i, seq in enumerate([2**31 - 2, 2**31 - 1, 0]):
        want = uuid.uuid5(namespace, f"7/2/t/3/{seq}/" + content(records[i]).decode()).hex
        assert out[i].key == want.encode()
        assert buffer_key(origin, "t", 3, i, records[i]) == want
    assert out[3].key is None  # immediate: passes through with its own key


def test_equal_delays_keep_the_order_they_were_accepted_in() -> None:
    records = [Incoming(None, bytes([i]), [(h.DELAY_MS, b"10")]) for i in range(50)]
    out, _ = route("t", 1, records, NOW, POLICY, buffer_partitions=6)
    seqs = []
    for o in out:
        decoded = buffer.decode(o.key, o.value, list(o.headers), NOW)
        assert isinstance(decoded, buffer.Scheduled)
        seqs.append(decoded.seq)
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)


def test_acceptance_order_rises_across_batches_and_kinds() -> None:
    # A batch reserves its numbers in one block at its first delayed record; immediate records
    # between delayed ones and the batches after it never reuse or go below them.
    def seqs(records: list[Incoming]) -> list[int]:
        out, _ = route("t", 1, records, NOW, POLICY, buffer_partitions=6)
        found = []
        for o in out:
            if o.kind is Kind.DELAYED:
                decoded = buffer.decode(o.key, o.value, list(o.headers), NOW)
                assert isinstance(decoded, buffer.Scheduled)
                found.append(decoded.seq)
        return found

    delayed = Incoming(None, b"d", [(h.DELAY_MS, b"10")])
    plain = Incoming(None, b"p", [])
    first = seqs([plain, delayed, plain, delayed, delayed])
    second = seqs([delayed, plain, delayed])
    assert len(first) == 3
    assert len(second) == 2
    assert first + second == sorted(set(first + second))


def test_id_is_assigned_when_absent() -> None:
    a = route_record("t", 0, Incoming(None, b"v", [(h.DELAY_LEVEL, b"99")]), NOW, POLICY)
    b = route_record("t", 0, Incoming(None, b"v", [(h.DELAY_LEVEL, b"1")]), NOW, POLICY)
    assert a.id
    assert b.id
    assert a.id != b.id
    assert a.deliver_at_ms == NOW + h.DEFAULT_LEVELS_MS[-1]  # above the maximum: the maximum


def test_cancel_goes_to_the_partition_of_its_id() -> None:
    out = route_record("any", 0, Incoming(None, b"", [(h.CANCEL, b"m-9")]), NOW, POLICY)
    assert out.kind is Kind.CANCEL
    assert out.partition == buffer.partition_for("m-9", PARTITIONS)  # where m-9's messages are
    assert out.key is not None
    assert buffer.decode(out.key, out.value, list(out.headers)) == buffer.Cancel(
        "m-9", out.key.decode()
    )


def test_a_delayed_record_needs_the_buffer_partitions() -> None:
    rec = Incoming(None, b"v", [(h.DELAY_MS, b"1")])
    with pytest.raises(BufferUnavailableError, match="__kdelay_buffer"):
        route("t", 0, [rec], NOW, POLICY)


def test_one_bad_record_rejects_the_batch() -> None:
    records = [Incoming(None, b"ok", []), Incoming(None, b"bad", [(h.DELAY_MS, b"x")])]
    with pytest.raises(RejectedRecordError, match=h.DELAY_MS) as rejected:
        route("t", 0, records, NOW, POLICY)
    assert isinstance(rejected.value.header_error, InvalidHeaderError)
    assert rejected.value.index == 1
    assert str(rejected.value) == "record 1: header 'kdelay-delay-ms': 'x' is not an integer"


def test_fast_path_only_skips_records_without_kdelay_header_names() -> None:
    plain = Incoming(None, b"v", [("app", h.DELAY_MS.encode()), ("x-kdelay-delay-ms", b"5")])
    assert route_record("t", 0, plain, NOW, POLICY).kind is Kind.IMMEDIATE
    delivered = Incoming(None, b"v", [("kdelay-error", b"1"), ("kdelay-source", b"t/0/1")])
    assert route_record("t", 0, delivered, NOW, POLICY).kind is Kind.IMMEDIATE
    later = Incoming(None, b"v", [("app", b"1"), (h.DELAY_MS, b"5")])
    assert route_record("t", 0, later, NOW, POLICY).deliver_at_ms == NOW + 5
    with pytest.raises(InvalidHeaderError, match=h.DELAY_MS):
        route_record("t", 0, Incoming(None, b"v", [("a", b""), (h.DELAY_MS, b"x")]), NOW, POLICY)


def test_records_without_an_id_for_one_target_partition_share_a_buffer_partition() -> None:
    records = [Incoming(None, bytes([i]), [(h.DELAY_MS, b"10")]) for i in range(40)]
    for partition in (0, 1, 2):
        out, _ = route("t", partition, records, NOW, POLICY, buffer_partitions=PARTITIONS)
        assert len({o.partition for o in out}) == 1  # appended together: exact ties
        assert {buffer.partition_for(o.id or "", PARTITIONS) for o in out} == {out[0].partition}


# -- look-alike header names take the slow path and are rejected -------------------------------


@pytest.mark.parametrize(
    "name", ["KDELAY-DELAY-MS", "kdelay-delay", "kdelay_delay_ms", "kDelay-id", "KDELAY-REPEAT"]
)
def test_a_look_alike_header_rejects_an_immediate_record_naming_its_index(name: str) -> None:
    records = [
        Incoming(None, b"ok", [("app", b"1")]),
        Incoming(None, b"typo", [("app", b"1"), (name, b"1000")]),
    ]
    with pytest.raises(RejectedRecordError) as rejected:
        route("t", 0, records, NOW, POLICY, buffer_partitions=PARTITIONS)
    assert rejected.value.index == 1
    assert isinstance(rejected.value.header_error, h.UnknownHeaderError)
    assert str(rejected.value).startswith(f"record 1: header {name!r}: ")


def test_a_look_alike_with_a_long_name_is_caught_on_the_limits_scan_too() -> None:
    # A name over a quarter of max_header_name_bytes (in characters) takes the slow scan.
    long_name = "KDELAY_" + "x" * 300
    with pytest.raises(RejectedRecordError, match="not a kdelay header"):
        route("t", 0, [Incoming(None, b"v", [(long_name, b"1")])], NOW, POLICY)


# -- internal topics (proxy/routing/internal_topics.py) --------------------------------------------

INTERNAL = ["__kdelay_dead_letter", "__kdelay_checkpoint", "__kdelay_x", "__consumer_offsets",
            "__transaction_state"]  # fmt: skip


@pytest.mark.parametrize("topic", INTERNAL)
@pytest.mark.parametrize(
    "headers",
    [[], [(h.DELAY_MS, b"10")], [(h.CANCEL, b"m-1")]],
    ids=["immediate", "delayed", "cancel"],
)
def test_an_internal_topic_is_refused_for_every_kind_of_record(
    topic: str, headers: list[tuple[str, bytes | None]]
) -> None:
    with pytest.raises(RefusedTopicError) as refused:
        route(topic, 0, [Incoming(None, b"v", headers)], NOW, POLICY, buffer_partitions=6)
    assert refused.value.topic == topic
    assert refused.value.index is None  # the whole topic
    assert topic in str(refused.value)
    assert "internal to" in str(refused.value)


@pytest.mark.parametrize(
    "headers", [[], [(h.DELAY_MS, b"10")], [(h.DELIVER_AT, b"2026-01-01T00:00:00Z")]]
)
def test_the_buffer_topic_takes_cancels_only(headers: list[tuple[str, bytes | None]]) -> None:
    records = [Incoming(None, b"", [(h.CANCEL, b"m-1")]), Incoming(None, b"v", headers)]
    with pytest.raises(RefusedTopicError) as refused:
        route(buffer.BUFFER_TOPIC, 0, records, NOW, POLICY, buffer_partitions=PARTITIONS)
    assert refused.value.index == 1
    assert str(refused.value).startswith(f"record 1: topic '{buffer.BUFFER_TOPIC}' is internal")
    assert "only a kdelay-cancel record may be sent to it" in str(refused.value)
    # What `kdelay cancel` sends: the buffer topic carries the cancel, as before.
    (out,), _ = route(
        buffer.BUFFER_TOPIC, 0, records[:1], NOW, POLICY, buffer_partitions=PARTITIONS
    )
    assert out.kind is Kind.CANCEL
    assert out.id == "m-1"


@pytest.mark.parametrize(
    ("topic", "refused"),
    [
        ("__kdelay_buffer", True),
        ("__kdelay_shard_1", True),
        ("__consumer_offsets", True),
        ("__share_group_state", True),
        ("_kdelay_buffer", False),
        ("__my_topic", False),
        ("orders", False),
        ("kdelay_buffer", False),
    ],
)
def test_the_internal_topic_rule(topic: str, refused: bool) -> None:
    assert (internal_topics.refusal(topic) is not None) is refused
    assert internal_topics.visible(topic) is (not refused or topic == buffer.BUFFER_TOPIC)
