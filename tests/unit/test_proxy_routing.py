"""Per-record routing (CONTRACT.md) with in-process fakes: through, buffered, cancelled."""

from __future__ import annotations

import pytest

from kdelay import buffer
from kdelay import headers as h
from kdelay.errors import InvalidHeaderError
from proxy.routing import Incoming, Kind, Outgoing, RejectedRecordError, route

NOW = 1_700_000_000_000
POLICY = h.DelayPolicy()


def route_record(
    topic: str, partition: int, rec: Incoming, now_ms: int, policy: h.DelayPolicy
) -> Outgoing:
    """``route`` for a batch of one record; raises the InvalidHeaderError of a header at fault."""
    try:
        (out,), _ = route(topic, partition, [rec], now_ms, policy)
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
    assert (out.topic, out.partition, out.key) == (buffer.BUFFER_TOPIC, -1, b"m-1")
    decoded = buffer.decode(out.key, out.value, list(out.headers))
    assert decoded == buffer.Scheduled("m-1", "t", 3, key, None, NOW + 1500, (("a", b"1"),))


def test_id_is_assigned_when_absent() -> None:
    a = route_record("t", 0, Incoming(None, b"v", [(h.DELAY_LEVEL, b"99")]), NOW, POLICY)
    b = route_record("t", 0, Incoming(None, b"v", [(h.DELAY_LEVEL, b"1")]), NOW, POLICY)
    assert a.id
    assert b.id
    assert a.id != b.id
    assert a.deliver_at_ms == NOW + h.DEFAULT_LEVELS_MS[-1]  # above the maximum: the maximum


def test_cancel_goes_to_the_buffer_keyed_by_id() -> None:
    out = route_record("any", 0, Incoming(None, b"", [(h.CANCEL, b"m-9")]), NOW, POLICY)
    assert out.kind is Kind.CANCEL
    assert out.key == b"m-9"
    assert buffer.decode(out.key, out.value, list(out.headers)) == buffer.Cancel("m-9")


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
