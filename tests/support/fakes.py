"""Typed in-process fakes of what the runtime takes from outside: a clock, librdkafka's producer
and consumer, the proxy's upstream Kafka and an admin client. Defined once, for every test.

Each fake behaves like the real thing where the code under test can tell (delivery reports
run inside ``poll``/``flush``, a consumer short of a full batch waits out its timeout, a
partition assigned twice is a conflict) and records what it was asked, for assertions. Time
only moves when a test (or a fake's simulated wait) moves it: nothing here reads the wall
clock, and only :meth:`FakeProducer.poll` without a clock blocks, on its queue of actions.

Threads: a fake belongs to the thread that drives it; :meth:`FakeProducer.act`,
:meth:`FakeProducer.ack_all` and :meth:`FakeProducer.go_fatal` may be called from any thread
(their work runs on the thread that polls, as librdkafka's callbacks do).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import kafka.errors as kerr
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewTopic

from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.route import Outgoing
from kdelay.proxy.routing.topics import TopicInfo
from kdelay.proxy.upstream.availability import UpstreamAvailability

#: A delivery report callback, as confluent_kafka.Producer.produce takes it.
Callback = Callable[[KafkaError | None, Message], None]
Headers = list[tuple[str, str | bytes | None]]

# -- time --------------------------------------------------------------------------------------


@dataclass
class FakeClock:
    """A wall clock and a monotonic clock (``kdelay.clock.Clock``) that move only with
    :meth:`advance` or :meth:`advance_ms`; :meth:`monotonic` also serves code that takes a
    ``Callable[[], float]``."""

    now_ms: int = 1_800_000_000_000
    mono: float = 100.0

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.now_ms += round(seconds * 1000)

    def advance_ms(self, ms: int) -> None:
        self.mono += ms / 1000
        self.now_ms += ms


# -- librdkafka's producer ---------------------------------------------------------------------


@dataclass
class Sent:
    """One record given to :meth:`FakeProducer.produce`."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int = -1
    timestamp: int = 0
    headers: Headers = field(default_factory=list)


def _no_error(_sent: Sent) -> KafkaError | None:
    return None


def _not_held(_sent: Sent) -> bool:
    return False


@dataclass
class FakeProducer:
    """confluent_kafka.Producer as kdelay drives it (the forwarder's sender, the proxy's
    upstream, the retry helper).

    ``produce`` queues a record (``produced``: every one, in order) or raises: the error
    ``sync_fail`` decides, or a fatal one once :meth:`go_fatal` ran. Its delivery report runs
    inside ``poll``/``flush`` unless ``hold`` keeps it back, with the error ``fail`` decides
    (None: acknowledged at the next ``offset``, and kept in ``sent``). ``poll(timeout)`` first
    moves ``clock`` by the timeout, as a real poll waits; without a clock, and with no report
    to serve, it waits up to the timeout for a test's action (:meth:`act`). ``events`` records
    ``produce <topic>`` and ``flush`` in order; ``conf`` is the configuration it was built
    with (its ``error_cb`` is called by :meth:`go_fatal`).
    """

    conf: dict[str, Any] = field(default_factory=dict)
    fail: Callable[[Sent], KafkaError | None] = _no_error
    sync_fail: Callable[[Sent], KafkaError | None] = _no_error
    hold: Callable[[Sent], bool] = _not_held
    clock: FakeClock | None = None
    events: list[str] = field(default_factory=list)
    produced: list[Sent] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    queued: list[tuple[Sent, Callback | None]] = field(default_factory=list)
    offset: int = 0
    fatal: bool = False
    purged: bool = False
    closed: threading.Event = field(default_factory=threading.Event)
    actions: queue.Queue[Callable[[], None]] = field(default_factory=queue.Queue)

    def produce(  # noqa: PLR0917 - mirrors confluent_kafka.Producer.produce
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callback | None = None,
        on_delivery: Callback | None = None,
        timestamp: int = 0,
        headers: Headers | None = None,
    ) -> None:
        assert not isinstance(value, str)
        assert not isinstance(key, str)
        if self.fatal:
            raise KafkaException(KafkaError(KafkaError._FATAL, "fatal state", fatal=True))
        sent = Sent(topic, key, value, partition, timestamp, list(headers or []))
        err = self.sync_fail(sent)
        if err is not None:
            raise KafkaException(err)
        self.events.append(f"produce {topic}")
        self.produced.append(sent)
        self.queued.append((sent, on_delivery or callback))

    def _report(self, done: list[tuple[Sent, Callback | None]]) -> None:
        for sent, cb in done:
            err = self.fail(sent)
            if err is None:
                self.sent.append(sent)
            msg = Message(topic=sent.topic, partition=sent.partition, offset=self.offset)
            self.offset += err is None
            if cb is not None:
                cb(err, msg)

    def _serve(self) -> int:
        done = [(s, cb) for s, cb in self.queued if not self.hold(s)]
        self.queued = [(s, cb) for s, cb in self.queued if self.hold(s)]
        self._report(done)
        return len(done)

    def poll(self, timeout: float = -1) -> int:
        if self.clock is not None and timeout > 0:
            self.clock.advance_ms(max(1, int(timeout * 1000)))
        served = self._serve()
        wait = 0.0 if self.clock is not None or served else max(timeout, 0.0)
        try:
            action = self.actions.get(timeout=wait) if wait else self.actions.get_nowait()
        except queue.Empty:
            return served
        action()
        return served + 1

    def flush(self, timeout: float = -1) -> int:
        self.events.append("flush")
        self._serve()
        return len(self.queued)

    def purge(self) -> None:
        self.purged = True
        self.queued = []

    def close(self) -> bool:
        self.closed.set()
        return True

    def to(self, topic: str) -> list[Sent]:
        """The acknowledged records of ``topic``."""
        return [s for s in self.sent if s.topic == topic]

    # -- the test's side, from any thread

    def act(self, action: Callable[[], None]) -> None:
        """Run ``action`` inside the next ``poll``, on the polling thread."""
        self.actions.put(action)

    def ack_all(self) -> None:
        """Acknowledge every queued record, held or not, inside the next ``poll``."""

        def run() -> None:
            done, self.queued = self.queued, []
            self._report(done)

        self.act(run)

    def go_fatal(self) -> None:
        """librdkafka's fatal idempotence error: reported through ``error_cb`` inside the next
        ``poll``; every ``produce`` from now on raises a fatal error."""
        self.fatal = True
        err = KafkaError(KafkaError._FATAL, "Fatal error: sequence desync", fatal=True)
        error_cb: Callable[[KafkaError], None] = self.conf["error_cb"]
        self.act(lambda: error_cb(err))


# -- librdkafka's consumer ---------------------------------------------------------------------


@dataclass
class FakeTopicMetadata:
    """A topic in a metadata answer: its partitions by id, or its error."""

    partitions: dict[int, object]
    error: KafkaError | None = None


@dataclass
class FakeMetadata:
    """A metadata answer (``list_topics``)."""

    topics: dict[str, FakeTopicMetadata]


@dataclass
class FakeConsumer:
    """confluent_kafka.Consumer as kdelay drives it (ingest's ``BufferConsumer``,
    ``take_batch``, the retry helper). Nothing sleeps: ``waited_s`` adds up simulated waits.

    Records: ``queued`` is what has arrived, in order; ``arriving`` arrives while a caller
    waits (a ``consume`` with a timeout, a ``poll`` that finds nothing). ``consume(n,
    timeout)`` returns at once only with ``n`` records, otherwise after the whole timeout, as
    librdkafka does; ``poll(timeout)`` returns as soon as one record is there.

    Partitions (ingest): every topic has the partitions of ``high`` (their high watermarks);
    those in ``leaderless`` have no leader yet; ``incremental_assign`` fills ``assigned``
    (partition -> offset), a partition assigned twice is a ``_CONFLICT``. Groups (the retry
    helper): ``subscribe``, ``assign`` (``assignment``), ``commit``, ``seek``, ``committed``
    (``committed_offsets``), and ``events``: ``commit``, ``close`` in order.
    """

    conf: dict[str, Any] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    queued: list[Message] = field(default_factory=list)
    arriving: list[Message] = field(default_factory=list)
    waited_s: float = 0.0
    high: dict[int, int] = field(default_factory=dict)
    leaderless: set[int] = field(default_factory=set)
    assigned: dict[int, int] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    assignment: list[TopicPartition] | None = None
    subscribed: list[str] = field(default_factory=list)
    on_assign: Callable[[Any, list[TopicPartition]], None] | None = None
    commits: list[list[tuple[str, int, int]]] = field(default_factory=list)
    seeks: list[tuple[str, int, int]] = field(default_factory=list)
    committed_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    closed: bool = False

    def _arrive(self) -> None:
        self.queued += self.arriving
        self.arriving = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if len(self.queued) < num_messages:
            self.waited_s += timeout  # librdkafka waits for a full batch
            if timeout > 0:
                self._arrive()
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out

    def poll(self, timeout: float = -1) -> Message | None:
        if not self.queued:
            self._arrive()
        if not self.queued:
            self.waited_s += timeout
            return None
        return self.queued.pop(0)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> FakeMetadata:
        partitions: dict[int, object] = {p: object() for p in self.high}
        return FakeMetadata({topic or "": FakeTopicMetadata(partitions)})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        if partition.partition in self.leaderless:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return 0, self.high[partition.partition]

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.partition in self.assigned:
                raise KafkaException(KafkaError(KafkaError._CONFLICT))
            self.assigned[tp.partition] = tp.offset

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(tp.topic, tp.partition, self.positions.get(tp.partition, -1001))
            for tp in partitions
        ]

    def subscribe(self, topics: list[str], on_assign: Any = None) -> None:
        self.subscribed, self.on_assign = topics, on_assign

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assignment = partitions

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        assert asynchronous is False
        self.events.append("commit")
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])
        return offsets

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append((partition.topic, partition.partition, partition.offset))

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        return [
            TopicPartition(
                t.topic, t.partition, self.committed_offsets.get((t.topic, t.partition), -1001)
            )
            for t in partitions
        ]

    def close(self) -> None:
        self.closed = True
        self.events.append("close")


# -- the proxy's upstream Kafka ----------------------------------------------------------------


class FakeUpstream:
    """The proxy's upstream (``proxy.upstream.producer.Upstream``) as the broker, the topic cache
    and the HTTP API use it: every batch taken at once (``written``; its first record at offset 0)
    unless ``fail`` is set, then that is raised. Topics: ``topics`` (name -> partitions; any other
    is unknown), or every name with ``partitions`` partitions when None; ``listed`` are the names
    ``all_topics`` gives. Each lookup is recorded (``looked_up``)."""

    cluster_id: str | None = "fake"
    bootstrap = "fake:9092"

    def __init__(
        self,
        *,
        partitions: int = 3,
        topics: Mapping[str, int] | None = None,
        listed: Iterable[str] = ("t",),
    ) -> None:
        self.metrics = ProxyMetrics()
        self.availability = UpstreamAvailability(self.bootstrap, self.metrics)
        self.partitions = partitions
        self.topics = None if topics is None else dict(topics)
        self.listed = list(listed)
        self.written: list[Outgoing] = []
        self.looked_up: list[str] = []
        self.fail: BaseException | None = None

    async def submit(self, records: list[Outgoing]) -> asyncio.Future[int]:
        if self.fail is not None:
            raise self.fail
        self.written.extend(records)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(0)
        return future

    async def send(self, records: list[Outgoing]) -> int:
        await asyncio.sleep(0)
        return await (await self.submit(records))

    def topic(self, name: str, *, create: bool) -> TopicInfo:
        self.looked_up.append(name)
        if self.topics is None:
            return TopicInfo(0, self.partitions)
        if name in self.topics:
            return TopicInfo(0, self.topics[name])
        return TopicInfo(int(kerr.UnknownTopicOrPartitionError.errno), 0)

    def all_topics(self) -> dict[str, TopicInfo]:
        topics = self.topics or {}
        return {n: TopicInfo(0, topics.get(n, self.partitions)) for n in self.listed}

    def reachable(self, timeout: float = 3.0) -> bool:
        return self.availability.available


# -- an admin client ---------------------------------------------------------------------------


def done(value: object = None, exc: BaseException | None = None) -> Future[Any]:
    """A future that is resolved already, as an admin client's answers are once waited on."""
    f: Future[Any] = Future()
    if exc is not None:
        f.set_exception(exc)
    else:
        f.set_result(value)
    return f


@dataclass
class FakeAdmin:
    """An AdminClient over ``brokers`` brokers and the ``existing`` topics (name ->
    ``message.timestamp.type``); ``race``: another client creates the topic first, wrongly."""

    brokers: int = 1
    existing: dict[str, str] = field(default_factory=dict)
    race: bool = False
    created: list[NewTopic] = field(default_factory=list)

    def list_topics(self, *args: Any, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(
            topics=dict.fromkeys(self.existing), brokers=dict.fromkeys(range(self.brokers))
        )

    def create_topics(self, new_topics: list[NewTopic], **kwargs: Any) -> dict[str, Future[Any]]:
        self.created.extend(new_topics)
        if self.race:
            err = KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS))
            self.existing[new_topics[0].topic] = "CreateTime"
            return {new_topics[0].topic: done(exc=err)}
        return {t.topic: done() for t in new_topics}

    def describe_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]:
        kind = self.existing[resources[0].name]
        return {resources[0]: done({"message.timestamp.type": SimpleNamespace(value=kind)})}
