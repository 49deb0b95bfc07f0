"""Fuzzing the request decoder and the whole connection pipeline (fake upstream).

Properties: any byte string either decodes or raises ProtocolError; a connection fed any bytes
answers or is closed within a deadline, never crashing the listener; a valid Produce request
whose record bytes are mangled is answered with a per-partition error, not a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceResponse

from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.server import KafkaServer, Limits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.topics import Advertised, Topics
from kdelay.proxy.wire import protocol as p
from tests.support.fakes import FakeUpstream
from tests.support.raw_client import (
    init_producer_id_request,
    metadata_request,
    produce_request,
    record_batch,
)

DEADLINE_S = 5.0


def _frames() -> list[bytes]:
    reqs = [
        ApiVersionsRequest(client_software_name="f", client_software_version="1", version=3),
        metadata_request(["t"]),
        init_producer_id_request(),
        produce_request("t", 0, record_batch([(b"k", b"v", [("h", b"x")])], compression=1)),
    ]
    out = []
    for r in reqs:
        r.with_header(correlation_id=1, client_id="fuzz")
        out.append(bytes(r.encode(header=True)))
    return out


VALID = _frames()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(frame) - 1))
        frame[i] = draw(st.integers(0, 255))
    cut = draw(st.integers(8, len(frame)))
    return bytes(frame[:cut])


@settings(max_examples=300, deadline=1000)
@given(data=st.one_of(st.binary(max_size=300), mutated()))
def test_decoder_raises_only_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(p.ProtocolError):
        p.decode_request(data)


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, int, FakeUpstream]]:
    upstream = FakeUpstream()
    metrics = ProxyMetrics()
    server = KafkaServer(metrics, Limits(max_request_bytes=1 << 20, idle_timeout_s=2))
    host, bound = await server.bind("127.0.0.1", 0)
    await server.serve(Broker(upstream, Topics(upstream), metrics, Advertised(1, host, bound)))
    try:
        yield host, bound, upstream
    finally:
        await server.close()


async def _exchange(host: str, port: int, data: bytes) -> bytes:
    """Send ``data``, half-close, and read everything until the proxy closes."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), DEADLINE_S)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _healthy(host: str, port: int) -> bool:
    frame = VALID[0]
    reply = await _exchange(host, port, struct.pack(">i", len(frame)) + frame)
    return len(reply) > 4


def _framed(data: bytes, frame_it: bool) -> bytes:
    return struct.pack(">i", len(data)) + data if frame_it else data


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(st.binary(max_size=200), mutated()), frame_it=st.booleans())
def test_connection_survives_any_bytes(data: bytes, frame_it: bool) -> None:
    async def run() -> None:
        async with _server() as (host, port, _):
            await _exchange(host, port, _framed(data, frame_it))  # bounded by DEADLINE_S
            assert await _healthy(host, port)

    asyncio.run(run())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(junk=st.binary(min_size=0, max_size=120), keep=st.integers(0, 80))
def test_mangled_record_batches_get_an_error_response(junk: bytes, keep: int) -> None:
    good = record_batch([(b"k", b"v", [])], compression=2)
    batch = good[:keep] + junk

    async def run() -> None:
        async with _server() as (host, port, upstream):
            req = produce_request("t", 0, batch)
            req.with_header(correlation_id=7, client_id="fuzz")
            reply = await _exchange(host, port, bytes(req.encode(header=True, framed=True)))
            assert len(reply) > 4, "no response to a well-formed Produce request"
            resp = ProduceResponse.decode(reply[4:], version=9, header=True)
            code = resp.responses[0].partition_responses[0].error_code
            assert code != 0 or batch == good or len(upstream.written) == 1

    asyncio.run(run())
