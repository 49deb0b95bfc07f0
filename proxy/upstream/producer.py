"""The proxy's side of upstream Kafka: one idempotent librdkafka producer, and metadata.

Threads: ``submit`` runs on the asyncio loop thread (librdkafka's produce is non-blocking and
thread-safe); one daemon thread ("kdelay-upstream-poll", supervised as ``upstream_poll``) serves
librdkafka's delivery and error callbacks through ``poll``. A delivery callback only counts down
its batch (proxy/upstream/delivery.py); the batch's asyncio future is resolved with one
``call_soon_threadsafe`` when its last record is acknowledged, so the loop is woken once per
batch, not per record. The records of
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

Availability (proxy/upstream/availability.py): every error librdkafka reports and every batch that
failed is counted (``kdelay_proxy_upstream_errors_total{error}``); a report that looks like an
outage (all brokers down, transport, timeouts) wakes the probe thread ("kdelay-upstream-probe"),
which asks upstream for metadata and marks it down when that fails, then every
``probe_interval_s`` until it answers again. An acknowledged batch marks it back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import kafka.errors as kerr
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from kdelay import logs
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.restarts import SupervisedComponents
from kdelay.proxy.routing.route import Kind, Outgoing
from kdelay.proxy.routing.topics import TopicInfo
from kdelay.proxy.upstream.availability import UpstreamAvailability
from kdelay.proxy.upstream.delivery import OUTAGE_CODES, Batch, UpstreamError

__all__ = ["POLL_COMPONENT", "Upstream", "UpstreamError"]

log = logs.get(__name__)

#: The poll thread's name as a supervised component.
POLL_COMPONENT = "upstream_poll"


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
        supervisor: SupervisedComponents | None = None,
        probe_interval_s: float = 1.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.supervisor = supervisor or SupervisedComponents(metrics)
        self.availability = UpstreamAvailability(bootstrap, metrics)
        self.probe_interval_s = probe_interval_s
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
        #: The last librdkafka report that looked like an outage (for the down reason).
        self._last_report = ""
        self._lock = threading.Lock()
        self._closed = False
        self._waiting: set[Batch] = set()
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
        self._prober = threading.Thread(
            target=self._probe, name="kdelay-upstream-probe", daemon=True
        )
        self._prober.start()
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
        if err.code() in OUTAGE_CODES:
            self._last_report = err.str()
            self.availability.suspect.set()
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
        """The poll thread, supervised (proxy/restarts.py): ``poll`` raises what a callback
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
        batch = Batch(loop, len(records), self.generation)
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

    def _settled(self, batch: Batch) -> Callable[[asyncio.Future[int]], None]:
        def forget(future: asyncio.Future[int]) -> None:
            with self._lock:
                self._waiting.discard(batch)
            exc = None if future.cancelled() else future.exception()
            if exc is None:
                self.availability.up("a produce was acknowledged")
            elif isinstance(exc, UpstreamError):
                self.metrics.upstream_errors.labels(exc.name or "unknown").inc()
                if exc.outage:
                    self.availability.suspect.set()

        return forget

    async def send(self, records: Sequence[Outgoing]) -> int:
        """Submit ``records`` and wait until all are acknowledged (see ``submit``)."""
        return await (await self.submit(records))

    def _abandon(self, batch: Batch, unproduced: int, why: str) -> None:
        if batch.error is None:
            batch.error = KafkaError(KafkaError._MSG_TIMED_OUT, why)
        # Counted with every other failed batch when it resolves (``_settled``).
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
        """Whether upstream answers a metadata request within ``timeout`` (blocking); the
        answer also marks it available or down (proxy/upstream/availability.py)."""
        try:
            with self._lookup_lock:
                meta = self._lookup.list_topics(timeout=timeout)
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            self.availability.down(
                self._down_reason(f"no metadata within {timeout:g} s: {err.str()}")
            )
            return False
        if not meta.brokers:
            self.availability.down(self._down_reason("metadata names no broker"))
            return False
        self.availability.up("metadata answered")
        return True

    def _down_reason(self, probe: str) -> str:
        report = self._last_report
        return f"{report} ({probe})" if report else probe

    def _probe(self) -> None:
        """The probe thread: a metadata request when an outage is suspected, and every
        ``probe_interval_s`` while upstream is down (see the module docstring)."""
        av = self.availability
        interval = self.probe_interval_s
        while not self._stop.is_set():
            if av.available:
                if not av.suspect.wait(interval):
                    continue
                av.suspect.clear()
            elif self._stop.wait(interval):
                return
            if self._stop.is_set():
                return
            try:
                self.reachable(timeout=max(1.0, 2 * interval))
            except Exception:
                log.warning("proxy.upstream_probe_failed", exc_info=True)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout``), then stop the poll thread and close both
        librdkafka clients, so nothing keeps reconnecting after the proxy stopped."""
        self._producer.flush(timeout)
        with self._lock:
            self._closed = True
        self._stop.set()
        self.availability.suspect.set()  # wakes the probe thread
        self._thread.join(timeout)
        self._prober.join(timeout)
        _dispose(self._producer)
        with self._lookup_lock:
            self._lookup.close()


def _dispose(producer: Any) -> None:
    """Drop what a producer still holds (its batches were answered already) and close it."""
    try:
        producer.purge()
        producer.flush(0)
        producer.close()
    except Exception:  # best effort on a producer already given up
        log.warning("proxy.upstream_dispose_failed", exc_info=True)
