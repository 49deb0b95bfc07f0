"""Per-record routing (CONTRACT.md) with in-process fakes: through, buffered, cancelled."""

from __future__ import annotations

import pytest

from kdelay import buffer
from kdelay import headers as h
from kdelay.errors import InvalidHeaderError
from proxy.routing import (
    BufferUnavailableError,
    Incoming,
    Kind,
    Origin,
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


def test_fast_path_only_skips_records_without_kdelay_header_names() -> None:
    plain = Incoming(None, b"v", [("app", h.DELAY_MS.encode()), ("x-kdelay-delay-ms", b"5")])
    assert route_record("t", 0, plain, NOW, POLICY).kind is Kind.IMMEDIATE
    unknown = Incoming(None, b"v", [("kdelay-unknown", b"1")])
    assert route_record("t", 0, unknown, NOW, POLICY).kind is Kind.IMMEDIATE
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
