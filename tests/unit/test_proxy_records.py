"""Record-batch parsing (proxy/wire/records.py): aiokafka's compiled parser behind kafka-python's
framing, through the broker with a fake upstream.

Pinned: the compiled classes are the ones in use (a silent fallback to pure Python would cost
most of the proxy's throughput); every codec round-trips keys, values, headers and timestamps,
null keys, values and header values included; a corrupt batch is CORRUPT_MESSAGE for its
partition, including batches crafted against the parser's own bounds checks.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import crc32c
import kafka.errors as kerr
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecordsBuilder

from kdelay.headers import in_namespace
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Kind, Outgoing
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.wire import protocol as p
from kdelay.proxy.wire import records
from tests.support.fakes import FakeUpstream
from tests.support.raw_client import produce_request

CODECS = [0, 1, 2, 3, 4]  # none, gzip, snappy, lz4, zstd
Headers = list[tuple[str, bytes | None]]
Rec = tuple[bytes | None, bytes | None, Headers, int]

_CRC_OFFSET = 17  # base offset (8), length (4), leader epoch (4), magic (1)
_ATTRIBUTES_OFFSET = 21


def _batch(recs: list[Rec], codec: int = 0) -> bytes:
    """A v2 batch from kafka-python's builder (the other implementation)."""
    builder = MemoryRecordsBuilder(2, codec, 10 * 1024 * 1024)
    builder.set_producer_state(7, 0, 0, False)
    for key, value, headers, ts in recs:
        builder.append(ts, key, value, headers)
    builder.close()
    return bytes(builder.buffer())


def _with_crc(batch: bytearray) -> bytes:
    """``batch`` with its CRC recomputed, so only the records are wrong."""
    struct.pack_into(">I", batch, _CRC_OFFSET, crc32c.crc32c(bytes(batch[_ATTRIBUTES_OFFSET:])))
    return bytes(batch)


def _produce(batch: bytes) -> tuple[Any, list[Outgoing]]:
    """The partition response for ``batch`` and what went upstream."""

    async def run() -> tuple[Any, list[Outgoing]]:
        upstream = FakeUpstream()
        broker = Broker(upstream, Topics(upstream), ProxyMetrics(), Advertised(1, "h", 1))
        req = produce_request("t", 0, batch)
        req.with_header(correlation_id=1, client_id="t")
        reply = await (await broker.handle(p.decode_request(bytes(req.encode(header=True)))))
        return reply.response.responses[0].partition_responses[0], upstream.written

    return asyncio.run(run())


def test_the_compiled_parser_is_in_use() -> None:
    """aiokafka falls back to pure Python silently (missing extension, AIOKAFKA_NO_EXTENSIONS):
    that must fail here, not show up as a slow proxy."""
    assert records.C_PARSER
    assert records.BatchParser.__module__ == "aiokafka.record._crecords.default_records"
    parsed = list(records.parse(_batch([(b"k", b"v", [], 1)])))
    assert type(parsed[0]).__module__ == "aiokafka.record._crecords.default_records"


_bytes = st.one_of(st.none(), st.binary(max_size=300))
_header = st.tuples(
    st.text(max_size=12).filter(lambda s: not in_namespace(s)),  # plain headers only
    st.one_of(st.none(), st.binary(max_size=40)),
)
_record = st.tuples(_bytes, _bytes, st.lists(_header, max_size=4), st.integers(0, 2**41 - 1))


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=25, deadline=None)
@given(recs=st.lists(_record, min_size=1, max_size=20))
def test_every_codec_round_trips_through_the_broker(codec: int, recs: list[Rec]) -> None:
    result, written = _produce(_batch(recs, codec))
    assert result.error_code == 0
    assert [(o.key, o.value, o.headers, o.timestamp_ms) for o in written] == [
        (key, value, headers, ts) for key, value, headers, ts in recs
    ]
    assert {(o.kind, o.topic, o.partition) for o in written} == {(Kind.IMMEDIATE, "t", 0)}


@pytest.mark.parametrize("codec", CODECS)
def test_nulls_and_empties_are_kept_apart(codec: int) -> None:
    recs: list[Rec] = [
        (None, None, [], 1_700_000_000_000),
        (b"", b"", [("", b""), ("n", None)], 1_700_000_000_001),
        (b"k", None, [("a", b"1"), ("a", b"2")], 1_700_000_000_002),
    ]
    result, written = _produce(_batch(recs, codec))
    assert result.error_code == 0
    assert [(o.key, o.value, o.headers, o.timestamp_ms) for o in written] == recs


def test_a_crc_mismatch_is_corrupt_message() -> None:
    batch = bytearray(_batch([(b"k", b"value", [("h", b"x")], 1)]))
    batch[-1] ^= 0xFF
    result, written = _produce(bytes(batch))
    assert result.error_code == kerr.CorruptRecordError.errno
    assert "CRC" in result.error_message
    assert written == []


def test_records_that_do_not_parse_are_corrupt_message() -> None:
    """Valid CRC, broken records: the compiled parser's error becomes CORRUPT_MESSAGE."""
    good = _batch([(b"k", b"value", [("h", b"x")], 1)])
    batch = bytearray(good)
    assert batch[-2:] == b"\x02x"  # the header value: length 1 (zigzag varint), b"x"
    batch[-2] = 0x04  # length 2: one byte more than the batch holds
    result, written = _produce(_with_crc(batch))
    assert result.error_code == kerr.CorruptRecordError.errno
    assert written == []


@pytest.mark.parametrize(
    "tail",
    [
        b"\x02",  # one header, and nothing after its count
        b"\x02\x02h\xff\xff\xff\xff",  # a header value length that runs off the end
        b"\x04\x02h\x01\xff\xff\xff\xff\xff",  # a null value, then the next key's runaway length
    ],
)
def test_varints_running_off_the_end_of_the_batch_are_corrupt_message(tail: bytes) -> None:
    """The compiled parser checks only a varint's first byte (and header varints not at all):
    records ending mid-varint are refused, never read past (records.parse pads the copy)."""
    good = bytearray(_batch([(b"k", b"v", [], 1)]))
    body = good[records.HEADER_SIZE :]
    assert body.endswith(b"\x00")  # the record's header count, 0
    record = body[1:-1] + tail  # the record after its length varint, headers replaced
    crafted = good[: records.HEADER_SIZE] + bytes([len(record) << 1]) + record
    struct.pack_into(">i", crafted, 8, len(crafted) - 12)
    result, written = _produce(_with_crc(crafted))
    assert result.error_code == kerr.CorruptRecordError.errno
    assert written == []


def test_a_batch_shorter_than_its_header_is_refused_before_parsing() -> None:
    with pytest.raises(ValueError, match="shorter than its header"):
        records.parse(bytes(records.HEADER_SIZE - 1))
