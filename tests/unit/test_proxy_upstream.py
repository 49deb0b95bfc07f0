"""proxy/upstream/producer.py with a fake librdkafka producer: acknowledgements, fatal errors and
replacement of the producer, and closing.

The fake behaves like confluent_kafka.Producer where it matters: callbacks (delivery reports,
error_cb) run inside poll() on the upstream poll thread, and a producer in a fatal state refuses
every produce() with a fatal KafkaException.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError

from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Kind, Outgoing
from kdelay.proxy.upstream.producer import Upstream, UpstreamError
from tests.support.fakes import FakeProducer

DEADLINE_S = 10.0


class FakeLookup:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def made() -> list[FakeProducer]:
    return []


@pytest.fixture
def upstream(made: list[FakeProducer]) -> Iterator[Upstream]:
    def factory(conf: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(conf=conf, hold=lambda _s: True))  # acked by ack_all()
        return made[-1]

    up = Upstream("fake:9092", ProxyMetrics(), producer_factory=factory, lookup_factory=FakeLookup)
    yield up
    up.close(timeout=DEADLINE_S)


def _records(n: int) -> list[Outgoing]:
    return [Outgoing(Kind.IMMEDIATE, "t", 0, b"k", f"v{i}".encode(), [], None) for i in range(n)]


def test_batch_resolves_when_every_record_is_acknowledged(
    upstream: Upstream, made: list[FakeProducer]
) -> None:
    async def run() -> None:
        acked = await upstream.submit(_records(3))
        assert not acked.done()
        made[0].ack_all()
        async with asyncio.timeout(DEADLINE_S):
            assert await acked == 0  # the first record's offset

    asyncio.run(run())


def test_batch_reports_the_offset_of_its_first_record_with_a_fixed_partition(
    upstream: Upstream, made: list[FakeProducer]
) -> None:
    """Delayed records (partition -1, the buffer topic) do not count: the proxy answers with
    the offset of the first immediate record."""

    async def run() -> None:
        delayed = Outgoing(Kind.DELAYED, "__kdelay_buffer", -1, b"id", b"v", [], None)
        acked = await upstream.submit([delayed, *_records(2)])
        only_delayed = await upstream.submit([delayed])
        made[0].ack_all()
        async with asyncio.timeout(DEADLINE_S):
            assert await acked == 1
            assert await only_delayed == -1

    asyncio.run(run())


def test_fatal_error_fails_waiting_batches_retriably_and_replaces_the_producer(
    upstream: Upstream, made: list[FakeProducer]
) -> None:
    async def run() -> None:
        waiting = await upstream.submit(_records(2))
        made[0].go_fatal()
        with pytest.raises(UpstreamError) as failed:
            async with asyncio.timeout(DEADLINE_S):
                await waiting
        assert failed.value.code == kerr.KafkaStorageError.errno
        assert kerr.for_code(failed.value.code).retriable
        assert len(made) == 2
        assert made[0].closed.wait(DEADLINE_S)  # the old one is disposed of
        assert made[0].purged
        # New requests go to the new producer and succeed.
        fresh = await upstream.submit(_records(1))
        made[1].ack_all()
        async with asyncio.timeout(DEADLINE_S):
            assert await fresh == 0
        assert upstream.generation == 2

    asyncio.run(run())


def test_fatal_refusal_on_produce_also_replaces_the_producer(
    upstream: Upstream, made: list[FakeProducer]
) -> None:
    """The fatal state can be met by produce() before error_cb has been served."""

    async def run() -> None:
        made[0].fatal = True
        refused = await upstream.submit(_records(2))
        with pytest.raises(UpstreamError) as failed:
            async with asyncio.timeout(DEADLINE_S):
                await refused
        assert kerr.for_code(failed.value.code).retriable
        assert len(made) == 2
        # A late error_cb of the same fatal error does not replace the producer again.
        made[0].conf["error_cb"](KafkaError(KafkaError._FATAL, "late report", fatal=True))
        assert len(made) == 2
        ok = await upstream.submit(_records(1))
        made[1].ack_all()
        async with asyncio.timeout(DEADLINE_S):
            assert await ok == 0

    asyncio.run(run())


def test_close_closes_both_clients() -> None:
    made: list[Any] = []

    def factory(kind: type[Any]) -> Callable[[dict[str, Any]], Any]:
        def make(conf: dict[str, Any]) -> Any:
            made.append(kind(conf))
            return made[-1]

        return make

    up = Upstream(
        "fake:9092",
        ProxyMetrics(),
        producer_factory=factory(FakeProducer),
        lookup_factory=factory(FakeLookup),
    )
    up.close(timeout=DEADLINE_S)
    producer, lookup = made
    assert producer.closed.is_set()
    assert lookup.closed
