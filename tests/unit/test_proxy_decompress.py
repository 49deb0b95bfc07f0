"""Bounded decompression (proxy/wire/decompress.py) for Kafka's four codecs, alone and in a Produce.

Properties: every codec round-trips what kafka-python (the same encoders the clients' formats
use) compresses; output past the limit is refused without ever holding much more than the limit
in memory; corrupt input is a DecompressError, never another exception.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable
from typing import Any

import kafka.errors as kerr
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec

from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.wire import decompress as d
from kdelay.proxy.wire import protocol as p
from tests.support.fakes import FakeUpstream
from tests.support.raw_client import produce_request, record_batch

ENCODERS = {
    d.GZIP: codec.gzip_encode,
    d.SNAPPY: codec.snappy_encode,  # xerial framing, as the Java client writes
    d.LZ4: codec.lz4_encode,
    d.ZSTD: codec.zstd_encode,
}
CODECS = [pytest.param(c, id=d.CODEC_NAMES[c]) for c in ENCODERS]


@pytest.mark.parametrize("codec_id", CODECS)
@settings(max_examples=25, deadline=None)
@given(data=st.binary(max_size=5000), repeat=st.integers(1, 50))
def test_round_trip(codec_id: int, data: bytes, repeat: int) -> None:
    raw = data * repeat
    assert d.decompress(codec_id, ENCODERS[codec_id](raw), len(raw)) == raw


def test_raw_snappy_without_framing() -> None:
    raw = b"abc" * 10_000
    assert d.decompress(d.SNAPPY, snappy.compress(raw), len(raw)) == raw
    with pytest.raises(d.TooLargeError):
        d.decompress(d.SNAPPY, snappy.compress(raw), len(raw) - 1)


@pytest.mark.parametrize("codec_id", CODECS)
def test_one_byte_over_the_limit_is_refused(codec_id: int) -> None:
    raw = bytes(range(256)) * 4000
    packed = ENCODERS[codec_id](raw)
    assert d.decompress(codec_id, packed, len(raw)) == raw
    with pytest.raises(d.TooLargeError, match=f"more than {len(raw) - 1} bytes"):
        d.decompress(codec_id, packed, len(raw) - 1)


BOMB_BYTES = 64 * 1024 * 1024
LIMIT = 1024 * 1024


@pytest.fixture(scope="module")
def bombs() -> dict[int, bytes]:
    zeros = bytes(BOMB_BYTES)
    return {c: enc(zeros) for c, enc in ENCODERS.items()}


@pytest.mark.parametrize("codec_id", CODECS)
def test_bomb_is_refused_within_bounded_memory(bombs: dict[int, bytes], codec_id: int) -> None:
    bomb = bombs[codec_id]
    assert len(bomb) < BOMB_BYTES // 5  # it is a bomb: small in, 64 MiB out
    tracemalloc.start()
    try:
        with pytest.raises(d.TooLargeError):
            d.decompress(codec_id, bomb, LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The input copy, the output up to the limit and one chunk; never the 64 MiB.
    assert peak < len(bomb) + LIMIT + 2 * d.CHUNK + 1024 * 1024, peak


def _garbage(_packed: bytes) -> bytes:
    return b"garbage" * 5


def _truncated(packed: bytes) -> bytes:
    return packed[: len(packed) // 2]


CORRUPTIONS = [
    pytest.param(codec_id, corrupt, id=f"{d.CODEC_NAMES[codec_id]}-{corrupt.__name__[1:]}")
    for codec_id in ENCODERS
    for corrupt in (_garbage, _truncated)
]


@pytest.mark.parametrize(("codec_id", "corrupt"), CORRUPTIONS)
def test_corrupt_input_is_a_decompress_error(
    codec_id: int, corrupt: Callable[[bytes], bytes]
) -> None:
    broken = corrupt(ENCODERS[codec_id](b"hello world " * 1000))
    with pytest.raises(d.DecompressError):
        d.decompress(codec_id, broken, 10**6)


def test_unknown_codec() -> None:
    with pytest.raises(d.DecompressError, match="codec 7"):
        d.decompress(7, b"x", 10)


def _partition_of(reply: Any) -> Any:
    response = reply.response
    assert response is not None
    return response.responses[0].partition_responses[0]


@pytest.mark.parametrize("codec_id", CODECS)
def test_produce_of_a_bomb_is_refused_for_that_partition(codec_id: int) -> None:
    """Through the broker: RECORD_LIST_TOO_LARGE naming the limit, nothing written; a batch
    under the limit with the same codec goes through."""

    async def run() -> None:
        upstream = FakeUpstream()
        broker = Broker(
            upstream,
            Topics(upstream),
            ProxyMetrics(),
            Advertised(1, "h", 1),
            max_decompressed_bytes=64 * 1024,
        )
        big = record_batch([(b"k", bytes(200 * 1024), [])], compression=codec_id)
        small = record_batch([(b"k", bytes(1000), [("a", b"1")])], compression=codec_id)
        assert len(big) < 64 * 1024
        results = []
        for batch in (big, small):
            req = produce_request("t", 0, batch)
            req.with_header(correlation_id=1, client_id="t")
            decoded = p.decode_request(bytes(req.encode(header=True)))
            results.append(_partition_of(await (await broker.handle(decoded))))
        refused, accepted = results
        assert refused.error_code == kerr.RecordListTooLargeError.errno
        assert "65536 bytes" in refused.error_message
        assert accepted.error_code == 0
        assert [(r.value, r.headers) for r in upstream.written] == [(bytes(1000), [("a", b"1")])]

    asyncio.run(run())


@pytest.mark.parametrize("checksum", [False, True])
def test_whole_zstd_frames_pass_and_every_cut_fails(checksum: bool) -> None:
    """Concatenated frames (one with an RLE block) decode; a cut anywhere inside is an error."""
    cctx = zstandard.ZstdCompressor(write_checksum=checksum)
    payload = b"a" * 200_000 + bytes(range(256)) * 50
    first = cctx.compress(payload)
    packed = first + cctx.compress(b"tail")
    assert d.decompress(d.ZSTD, packed, 10**6) == payload + b"tail"
    assert d.decompress(d.ZSTD, first, 10**6) == payload
    for cut in [*range(1, len(packed), max(1, len(packed) // 97)), len(packed) - 1]:
        if cut == len(first):
            continue  # whole frames: valid
        with pytest.raises(d.DecompressError):
            d.decompress(d.ZSTD, packed[:cut], 10**6)
