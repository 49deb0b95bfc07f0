"""The proxy's side of upstream Kafka: one idempotent librdkafka producer, and metadata.

Threads: ``submit`` runs on the asyncio loop thread (librdkafka's produce is non-blocking and
thread-safe); one daemon thread ("kdelay-upstream-poll", supervised as ``upstream_poll``) serves
librdkafka's delivery and error callbacks through ``poll``. A delivery callback only counts down
its batch; the batch's asyncio future is resolved with one ``call_soon_threadsafe`` when its
last record is acknowledged, so the loop is woken once per batch, not per record. The records of
a batch share one delivery callback (bound once per batch, not a closure per record); only the
first immediate record has its own, which keeps its offset. Metadata lookups
block and run in worker threads.

Every record is written with acks=all by an idempotent producer, so a future that resolves
without error means every record of the batch is durable upstream.

Fatal errors: librdkafka's idempotent producer can enter a fatal state (e.g. a sequence gap
it cannot repair); it then refuses every produce call for good. On the fatal error (reported by
``error_cb``, a delivery report, or a refused produce call) the proxy fails every batch still
waiting on that producer with a retriable error (``KAFKA_STORAGE_ERROR``: the client retries,
nothing of those batches is known durable; records of them may already be upstream, so a retry
can duplicate them), replaces the producer with a new one, and disposes of the old one on a
separate thread. ``_lock`` guards the producer generation and the set of waiting batches, which
both the loop thread and the poll thread touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import kafka.errors as kerr
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from kdelay import logs
from kdelay.errors import KdelayError
from proxy.metrics import ProxyMetrics
from proxy.routing import Kind, Outgoing
from proxy.supervision import Supervisor
from proxy.topics import TopicInfo

log = logs.get(__name__)

#: The poll thread's name as a supervised component.
POLL_COMPONENT = "upstream_poll"


class UpstreamError(KdelayError):
    """Upstream Kafka did not take a batch; ``code`` is the Kafka error to give the client."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def kafka_code(err: KafkaError) -> int:
    """The Kafka error code a client should see for a librdkafka delivery error.

    Broker errors keep their own code; librdkafka-local ones (timeouts, transport, fatal
    idempotence states) become retriable codes, because nothing of that batch is known durable.
    """
    if err.fatal():
        # The producer is replaced (see the module docstring): a retry goes to a new one.
        return int(kerr.KafkaStorageError.errno)
    code = int(err.code())
    if code > 0:
        return code
    if code in (KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC):
        return int(kerr.UnknownTopicOrPartitionError.errno)
    return int(kerr.RequestTimedOutError.errno)


class _Batch:
    """Countdown of one batch's deliveries; touched by the poll thread only after produce."""

    __slots__ = ("base", "error", "failed", "future", "generation", "lock", "loop", "remaining")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, generation: int = 0) -> None:
        self.loop = loop
        self.future: asyncio.Future[int] = loop.create_future()
        #: Offset of the first immediate record (-1: none, or not yet).
        self.base = -1
        self.remaining = size
        self.error: KafkaError | None = None
        self.failed: KafkaError | None = None
        self.generation = generation
        self.lock = threading.Lock()

    def delivered(self, err: KafkaError | None, _msg: Message) -> None:
        """librdkafka's delivery report of one record (poll thread)."""
        if err is not None:
            self.error = err
        self.countdown(1)

    def delivered_base(self, err: KafkaError | None, msg: Message) -> None:
        """The delivery report of the record whose offset the batch reports."""
        if err is None:
            self.base = msg.offset() or 0
        self.delivered(err, msg)

    def countdown(self, n: int) -> None:
        # The poll thread counts deliveries; the loop thread counts records it never produced.
        with self.lock:
            self.remaining -= n
            last = self.remaining == 0
        if last:
            self._wake()

    def fail(self, err: KafkaError) -> None:
        """Resolve now with ``err`` whatever is still outstanding (any thread)."""
        with self.lock:
            self.failed = err
            self.remaining = -(2**31)  # later deliveries no longer reach zero
        self._wake()

    def _wake(self) -> None:
        # The loop may be gone when a disposed producer reports late (shutdown).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self.future.done():
            return
        err = self.failed or self.error
        if err is not None:
            self.future.set_exception(
                UpstreamError(kafka_code(err), f"upstream Kafka: {err.str()}")
            )
        else:
            self.future.set_result(self.base)


class Upstream:
    """Writes routed records to upstream Kafka and answers metadata questions about it."""

    def __init__(
        self,
        bootstrap: str,
        metrics: ProxyMetrics,
        *,
        timeout_ms: int = 30_000,
        linger_ms: float = 1.0,
        extra: dict[str, str] | None = None,
        producer_factory: Callable[[dict[str, Any]], Any] = Producer,
        lookup_factory: Callable[[dict[str, Any]], Any] = Consumer,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.supervisor = supervisor or Supervisor(metrics)
        self.timeout_ms = timeout_ms
        common = {"bootstrap.servers": bootstrap, **(extra or {})}
        self._producer_conf: dict[str, Any] = {
            **common,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
            "message.timeout.ms": timeout_ms,
            "request.timeout.ms": min(timeout_ms, 30_000),
            "queue.buffering.max.messages": 1_000_000,
            # Java's default: the buffer topic is keyed by id and other writers may be JVMs.
            "partitioner": "murmur2_random",
        }
        self._producer_factory = producer_factory
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: set[_Batch] = set()
        #: Producers created so far (1 + replacements after fatal errors).
        self.generation = 0
        self._producer: Any = self._new_producer()
        # Metadata for clients that asked not to auto-create: a consumer never creates topics.
        self._lookup = lookup_factory(
            {
                **common,
                "group.id": "kdelay-proxy-metadata",
                "allow.auto.create.topics": False,
                "enable.auto.commit": False,
            }
        )
        self._lookup_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kdelay-upstream-poll", daemon=True)
        self._thread.start()
        self.cluster_id: str | None = None

    def _new_producer(self) -> Any:
        """A producer for the next generation; its error callback knows which one it is."""
        self.generation += 1
        generation = self.generation

        def on_error(err: KafkaError) -> None:
            self._on_error(err, generation)

        return self._producer_factory({**self._producer_conf, "error_cb": on_error})

    def _on_error(self, err: KafkaError, generation: int) -> None:
        self.metrics.upstream_errors.labels(err.name()).inc()
        log.warning("proxy.upstream_error", error=err.str(), code=err.name(), fatal=err.fatal())
        if err.fatal():
            self._replace(err, generation)

    def _replace(self, err: KafkaError, generation: int) -> None:
        """After a fatal error of producer ``generation``: fail what waits on it, start anew."""
        with self._lock:
            if generation != self.generation or self._closed:
                return  # already replaced (several reports of one fatal error), or stopping
            old = self._producer
            self._producer = self._new_producer()
            waiting, self._waiting = self._waiting, set()
        log.warning(
            "proxy.upstream_producer_replaced",
            error=err.str(),
            failed_batches=len(waiting),
            generation=self.generation,
        )
        for batch in waiting:
            batch.fail(err)
        threading.Thread(
            target=_dispose, args=(old,), name="kdelay-upstream-dispose", daemon=True
        ).start()

    def _poll(self) -> None:
        """The poll thread, supervised (proxy/supervision.py): ``poll`` raises what a callback
        raised; the loop logs and counts it and polls again after the backoff, so delivery
        reports never silently stop being served."""
        failed = False
        while not self._stop.is_set():
            try:
                self._producer.poll(0.05)  # the current producer: replaced after a fatal error
            except Exception as exc:  # noqa: BLE001 - any callback error; supervised
                backoff = self.supervisor.failed(POLL_COMPONENT, exc)
                if backoff is None:
                    return  # given up: the process exits
                failed = True
                self._stop.wait(backoff)
                continue
            if failed:
                failed = False
                self.supervisor.recovered(POLL_COMPONENT)

    async def submit(self, records: Sequence[Outgoing]) -> asyncio.Future[int]:
        """Hand ``records`` to librdkafka in order; once every one is acknowledged the returned
        future yields the offset of the first immediate record (in its own partition), or -1
        when there is none; it raises UpstreamError (with the Kafka error code for the
        client) when any failed.

        Returns as soon as all are queued, so a caller that awaits it before reading its next
        request keeps upstream order equal to arrival order. It waits only while librdkafka's
        queue is full: that wait is the backpressure on the client.
        """
        loop = asyncio.get_running_loop()
        immediate = Kind.IMMEDIATE
        batch = _Batch(loop, len(records), self.generation)
        if not records:
            batch.future.set_result(-1)
            return batch.future
        producer = self._producer
        with self._lock:
            self._waiting.add(batch)
        batch.future.add_done_callback(self._settled(batch))
        deadline = time.monotonic() + self.timeout_ms / 1000
        produce = producer.produce
        delivered = batch.delivered
        base = next((i for i, rec in enumerate(records) if rec.kind is immediate), -1)
        for i, rec in enumerate(records):
            ts = rec.timestamp_ms
            while True:
                try:
                    # partition -1 is librdkafka's "unassigned" (the partitioner chooses) and
                    # timestamp 0 its "now": the same as leaving them out.
                    produce(
                        rec.topic,
                        value=rec.value,
                        key=rec.key,
                        partition=rec.partition,
                        on_delivery=batch.delivered_base if i == base else delivered,
                        timestamp=ts if ts is not None and ts > 0 else 0,
                        headers=rec.headers or None,
                    )
                    break
                except BufferError:
                    if time.monotonic() > deadline:
                        self._abandon(batch, len(records) - i, "local queue full")
                        return batch.future
                    await asyncio.sleep(0.002)
                except KafkaException as exc:
                    err: KafkaError = exc.args[0]
                    if err.fatal():
                        # Records of this batch already on that producer never count down.
                        batch.fail(err)
                        self._replace(err, batch.generation)
                        return batch.future
                    batch.error = err
                    self._abandon(batch, len(records) - i, err.str())
                    return batch.future
        return batch.future

    def _settled(self, batch: _Batch) -> Callable[[asyncio.Future[int]], None]:
        def forget(_future: asyncio.Future[int]) -> None:
            with self._lock:
                self._waiting.discard(batch)

        return forget

    async def send(self, records: Sequence[Outgoing]) -> int:
        """Submit ``records`` and wait until all are acknowledged (see ``submit``)."""
        return await (await self.submit(records))

    def _abandon(self, batch: _Batch, unproduced: int, why: str) -> None:
        if batch.error is None:
            batch.error = KafkaError(KafkaError._MSG_TIMED_OUT, why)
        self.metrics.upstream_errors.labels(batch.error.name()).inc()
        log.warning("proxy.upstream_produce_failed", error=why)
        # Records already handed to librdkafka still report; count the rest down now.
        batch.countdown(unproduced)

    def topic(self, name: str, *, create: bool) -> TopicInfo:
        """Upstream's view of ``name`` (blocking). ``create`` asks upstream to auto-create it
        when its configuration allows, as a client's Metadata request may."""
        handle: Producer | Consumer = self._producer if create else self._lookup
        with self._lookup_lock if not create else contextlib.nullcontext():
            meta = handle.list_topics(name, timeout=10)
        self.cluster_id = meta.cluster_id
        t = meta.topics.get(name)
        if t is None:
            return TopicInfo(int(kerr.UnknownTopicOrPartitionError.errno), 0)
        code = int(t.error.code()) if t.error is not None else 0
        return TopicInfo(code if code > 0 else 0, len(t.partitions))

    def all_topics(self) -> dict[str, TopicInfo]:
        """Every topic upstream (blocking)."""
        with self._lookup_lock:
            meta = self._lookup.list_topics(timeout=10)
        self.cluster_id = meta.cluster_id
        out: dict[str, TopicInfo] = {}
        for name, t in meta.topics.items():
            code = int(t.error.code()) if t.error is not None else 0
            out[name] = TopicInfo(code if code > 0 else 0, len(t.partitions))
        return out

    def reachable(self, timeout: float = 3.0) -> bool:
        """Whether upstream answers a metadata request within ``timeout`` (blocking)."""
        try:
            with self._lookup_lock:
                meta = self._lookup.list_topics(timeout=timeout)
        except KafkaException:
            return False
        return bool(meta.brokers)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop the poll thread and close both
        librdkafka clients, so nothing keeps reconnecting after the proxy stopped."""
        self._producer.flush(timeout)
        with self._lock:
            self._closed = True
        self._stop.set()
        self._thread.join(timeout)
        _dispose(self._producer)
        self._lookup.close()


def _dispose(producer: Any) -> None:
    """Drop what a producer still holds (its batches were answered already) and close it."""
    try:
        producer.purge()
        producer.flush(0)
        producer.close()
    except Exception:  # best effort on a producer already given up
        log.warning("proxy.upstream_dispose_failed", exc_info=True)
