"""The Kafka listener's connection contract with an in-process upstream the test controls:
idle timeout, backpressure, the process-wide memory budget, response order, and retries around
a failed batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kafka.errors as kerr
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataResponse
from kafka.protocol.producer import ProduceResponse

from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.server import KafkaServer, Limits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Outgoing
from kdelay.proxy.routing.topics import Advertised, TopicInfo, Topics
from kdelay.proxy.upstream.producer import UpstreamError
from kdelay.proxy.wire import protocol as p
from tests.support.raw_client import metadata_request, produce_request, record_batch

DEADLINE_S = 10.0


class GatedUpstream:
    """Takes every batch at once (stage 1) but acknowledges only when the test says so."""

    cluster_id: str | None = "fake"

    def __init__(self) -> None:
        self.submitted: list[list[Outgoing]] = []
        self.acks: list[asyncio.Future[int]] = []
        self.changed = asyncio.Event()

    async def submit(self, records: list[Outgoing]) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.submitted.append(list(records))
        self.acks.append(future)
        self.changed.set()
        return future

    def ack(self, index: int, error: int = 0) -> None:
        if error:
            self.acks[index].set_exception(UpstreamError(error, "upstream said no"))
        else:
            self.acks[index].set_result(0)

    async def wait_submitted(self, n: int) -> None:
        async with asyncio.timeout(DEADLINE_S):
            while len(self.submitted) < n:
                self.changed.clear()
                await self.changed.wait()

    def topic(self, name: str, *, create: bool) -> TopicInfo:
        return TopicInfo(0, 1)

    def all_topics(self) -> dict[str, TopicInfo]:
        return {"t": TopicInfo(0, 1)}


@contextlib.asynccontextmanager
async def _server(
    limits: Limits, budget: RequestBudget | None = None
) -> AsyncIterator[tuple[int, GatedUpstream, Broker]]:
    upstream = GatedUpstream()
    metrics = ProxyMetrics()
    server = KafkaServer(metrics, limits, budget=budget)
    host, port = await server.bind("127.0.0.1", 0)
    broker = Broker(upstream, Topics(upstream), metrics, Advertised(1, host, port))
    await server.serve(broker)
    try:
        yield port, upstream, broker
    finally:
        await server.close()


def _frame(request: Any, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(request.encode(header=True, framed=True))


def _api_versions() -> Any:
    return ApiVersionsRequest(client_software_name="t", client_software_version="1", version=3)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(DEADLINE_S):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(size)


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cid: int) -> int:
    writer.write(_frame(_api_versions(), cid))
    await writer.drain()
    resp = ApiVersionsResponse.decode(await _read_frame(reader), version=3, header=True)
    assert resp.error_code == 0
    return int(resp.header.correlation_id)


async def _closed(reader: asyncio.StreamReader) -> None:
    """Returns when the proxy closed the connection (EOF or reset)."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(65536):
            pass


def test_idle_connection_is_closed_but_busy_ones_are_not() -> None:
    idle_s = 0.3

    async def run() -> None:
        async with _server(Limits(idle_timeout_s=idle_s)) as (port, upstream, _):
            # waiting: a Produce the upstream does not acknowledge yet (owed a response).
            w_reader, w_writer = await asyncio.open_connection("127.0.0.1", port)
            w_writer.write(_frame(produce_request("t", 0, record_batch([(b"k", b"v", [])])), 1))
            await upstream.wait_submitted(1)
            # active: keeps talking; idle: connects after both and says nothing.
            a_reader, a_writer = await asyncio.open_connection("127.0.0.1", port)
            await _round_trip(a_reader, a_writer, 1)
            i_reader, i_writer = await asyncio.open_connection("127.0.0.1", port)
            opened = time.monotonic()
            idle_closed = asyncio.create_task(_closed(i_reader))
            cid = 1
            async with asyncio.timeout(DEADLINE_S):
                while not idle_closed.done():
                    cid += 1
                    assert await _round_trip(a_reader, a_writer, cid) == cid
            assert time.monotonic() - opened >= idle_s
            # The idle one went after the timeout; the other two have been connected longer.
            assert await _round_trip(a_reader, a_writer, cid + 1) == cid + 1
            upstream.ack(0)
            resp = ProduceResponse.decode(await _read_frame(w_reader), version=9, header=True)
            assert resp.responses[0].partition_responses[0].error_code == 0
            assert await _round_trip(w_reader, w_writer, 2) == 2
            for w in (w_writer, a_writer, i_writer):
                w.close()

    asyncio.run(run())


def test_backpressure_stops_reading_and_resumes_in_order() -> None:
    inflight, total = 2, 40

    async def run() -> None:
        async with _server(Limits(max_inflight=inflight)) as (port, upstream, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for i in range(total):
                batch = record_batch([(b"k", f"v{i}".encode(), [])])
                writer.write(_frame(produce_request("t", 0, batch), i + 1))
            await writer.drain()  # every request is written: the proxy has them to read
            await upstream.wait_submitted(inflight)
            # Another connection is served meanwhile: the loop ran well past the moment the
            # first one's requests were readable, yet no more of them were read.
            p_reader, p_writer = await asyncio.open_connection("127.0.0.1", port)
            for cid in range(1, 4):
                assert await _round_trip(p_reader, p_writer, cid) == cid
            assert len(upstream.submitted) == inflight
            # Upstream recovers, acknowledging out of order: responses still leave in order.
            acked = 0
            while acked < total:
                await upstream.wait_submitted(min(total, acked + inflight))
                for i in reversed(range(acked, len(upstream.submitted))):
                    upstream.ack(i)
                acked = len(upstream.submitted)
                assert acked <= total
            cids = []
            for _ in range(total):
                resp = ProduceResponse.decode(await _read_frame(reader), version=9, header=True)
                assert resp.responses[0].partition_responses[0].error_code == 0
                cids.append(resp.header.correlation_id)
            assert cids == list(range(1, total + 1))
            assert [b[0].value for b in upstream.submitted] == [
                f"v{i}".encode() for i in range(total)
            ]
            writer.close()
            p_writer.close()

    asyncio.run(run())


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition`` holds (checked between loop turns), or fail after the deadline."""
    try:
        async with asyncio.timeout(DEADLINE_S):
            while not condition():  # noqa: ASYNC110 - the server's own state, no event to await
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def test_a_frame_waits_unread_for_memory_while_small_requests_pass() -> None:
    """Connection A announces a 6 KiB frame and sends part of it: it holds 6 KiB of an 8 KiB
    budget. B's 4 KiB Produce then waits, unread, while C's small requests are answered; once
    A goes away its bytes are given back and B is read and answered."""
    limit = 8 * 1024

    async def run() -> None:
        budget = RequestBudget(limit)
        async with _server(Limits(max_request_bytes=limit), budget) as (port, upstream, _):
            _, a_writer = await asyncio.open_connection("127.0.0.1", port)
            a_writer.write(struct.pack(">i", 6 * 1024) + b"\0" * 100)
            await _until(lambda: budget.used == 6 * 1024, "A to reserve its frame")
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", port)
            big = record_batch([(b"k", b"x" * 4000, [])])
            b_writer.write(_frame(produce_request("t", 0, big), 1))
            await _until(lambda: budget.waiting == 1, "B to wait for memory")
            c_reader, c_writer = await asyncio.open_connection("127.0.0.1", port)
            for cid in range(1, 4):
                assert await _round_trip(c_reader, c_writer, cid) == cid
            assert upstream.submitted == []
            a_writer.close()  # A's partial frame is dropped: its 6 KiB are free again
            await upstream.wait_submitted(1)
            upstream.ack(0)
            resp = ProduceResponse.decode(await _read_frame(b_reader), version=9, header=True)
            assert resp.responses[0].partition_responses[0].error_code == 0
            await _until(lambda: budget.used == 0, "every reservation to be given back")
            b_writer.close()
            c_writer.close()

    asyncio.run(run())


def _produce(broker: Broker, batch: bytes) -> Any:
    req = produce_request("t", 0, batch)
    req.with_header(correlation_id=1, client_id="t")
    return broker.handle(p.decode_request(bytes(req.encode(header=True))))


def _idempotent_producer() -> tuple[GatedUpstream, Broker, Callable[[int, bytes], bytes]]:
    """A broker over a gated upstream, and a one-record batch maker for one idempotent
    producer of it: ``batch(base_sequence, value)``."""
    upstream = GatedUpstream()
    broker = Broker(upstream, Topics(upstream), ProxyMetrics(), Advertised(1, "h", 1))
    pid, epoch = broker.producers.init_producer()

    def batch(seq: int, value: bytes) -> bytes:
        return record_batch([(b"k", value, [])], producer_id=pid, epoch=epoch, base_sequence=seq)

    return upstream, broker, batch


def _error_of(reply: Any) -> int:
    return int(reply.response.responses[0].partition_responses[0].error_code)


def test_retry_of_a_failed_batch_behind_a_later_one_is_written_once() -> None:
    """B1 fails retriably upstream while B2 (later, same partition) is in flight and succeeds:
    the retry of B1 is written again (not refused forever), B2's retry is not written twice."""

    async def run() -> None:
        upstream, broker, batch = _idempotent_producer()
        b1 = await _produce(broker, batch(0, b"one"))
        b2 = await _produce(broker, batch(1, b"two"))
        upstream.ack(0, error=kerr.RequestTimedOutError.errno)
        upstream.ack(1)
        assert _error_of(await b1) == kerr.RequestTimedOutError.errno
        assert _error_of(await b2) == 0
        retry1 = await _produce(broker, batch(0, b"one"))
        assert len(upstream.submitted) == 3
        upstream.ack(2)
        assert _error_of(await retry1) == 0
        retry2 = await _produce(broker, batch(1, b"two"))
        assert _error_of(await retry2) == 0
        again = await _produce(broker, batch(0, b"one"))
        assert _error_of(await again) == 0
        assert [b[0].value for b in upstream.submitted] == [b"one", b"two", b"one"]
        nxt = await _produce(broker, batch(2, b"three"))
        upstream.ack(3)
        assert _error_of(await nxt) == 0

    asyncio.run(run())


def test_retries_after_two_failures_are_accepted_in_order() -> None:
    async def run() -> None:
        upstream, broker, batch = _idempotent_producer()
        b1 = await _produce(broker, batch(0, b"one"))
        b2 = await _produce(broker, batch(1, b"two"))
        upstream.ack(0, error=kerr.KafkaStorageError.errno)
        upstream.ack(1, error=kerr.KafkaStorageError.errno)
        assert _error_of(await b1) == kerr.KafkaStorageError.errno
        assert _error_of(await b2) == kerr.KafkaStorageError.errno
        r1 = await _produce(broker, batch(0, b"one"))
        r2 = await _produce(broker, batch(1, b"two"))
        upstream.ack(2)
        upstream.ack(3)
        assert (_error_of(await r1), _error_of(await r2)) == (0, 0)
        assert [b[0].value for b in upstream.submitted] == [b"one", b"two", b"one", b"two"]

    asyncio.run(run())


def test_close_does_not_wait_for_unacknowledged_requests() -> None:
    async def run() -> None:
        upstream = GatedUpstream()
        metrics = ProxyMetrics()
        server = KafkaServer(metrics)
        _, port = await server.bind("127.0.0.1", 0)
        await server.serve(Broker(upstream, Topics(upstream), metrics, Advertised(1, "h", 1)))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_frame(produce_request("t", 0, record_batch([(b"k", b"v", [])])), 1))
        await upstream.wait_submitted(1)
        async with asyncio.timeout(DEADLINE_S):
            await server.close()
            await _closed(reader)
        writer.close()

    asyncio.run(run())


def test_metadata_advertises_the_bound_address() -> None:
    """The broker is built once the listener is bound: the very first Metadata response names
    the port the listener got, not a placeholder."""

    async def run() -> None:
        async with _server(Limits()) as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_frame(metadata_request(["t"]), 1))
            await writer.drain()
            resp = MetadataResponse.decode(await _read_frame(reader), version=12, header=True)
            assert [(b.host, b.port) for b in resp.brokers] == [("127.0.0.1", port)]
            assert [(t.name, len(t.partitions)) for t in resp.topics] == [("t", 1)]
            writer.close()

    asyncio.run(run())
