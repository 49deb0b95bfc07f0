"""The retrying consumer of :mod:`kdelay.retry`: its loop, its commit rule and its group membership.

The consumer subscribes to its topics and to its retry topic (``<group.id>.retry``). When the
handler raises, the message is produced again through the kdelay proxy (one idempotent producer,
acks=all) to the retry topic with the next backoff, or after the last attempt to the dead-letter
topic (``<group.id>.dlq``); :mod:`kdelay.retry.plan` decides the record and its headers.

Commit rule: messages are handled in order, up to ``batch_size`` per poll. The poll's retries
and dead letters are produced and awaited (flush); only then are its offsets committed,
synchronously. A retry or dead letter that is not acknowledged (the proxy is down past
``message.timeout.ms``, or refuses the record) leaves its message's offset, and those after it
in its partition, uncommitted: the partition is rewound to that message, the producer is
recreated and :class:`RetryProduceError` is raised. Calling ``poll_once`` again handles the
message again; a consumer that stops, or crashes at any point, leaves it to the next member of
the group. So delivery is at least once: a crash between a produce and its commit hands the
message to the handler again (and may produce its retry twice).

A retry-topic partition this group has never committed starts from its beginning, whatever
``auto.offset.reset`` says: with ``latest``, a retry released while its partition had no owner
would otherwise be skipped.

Threads: one thread drives a RetryingConsumer (``poll_once``, ``run``, ``close``), as with a
confluent-kafka Consumer; the handler runs on it. Metrics may be read from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from prometheus_client import REGISTRY, CollectorRegistry

from kdelay import logs
from kdelay.consuming import take_batch
from kdelay.errors import ConfigError, KdelayError
from kdelay.retry import setup
from kdelay.retry.plan import Header, Kind, Next, Origin, RetryPolicy, attempt_of, next_record

__all__ = ["Handler", "RetryProduceError", "RetryingConsumer"]

log = logs.get(__name__)

#: The user's code: returns when the message is handled, raises to have it retried.
Handler = Callable[[Message], None]


class RetryProduceError(KdelayError):
    """A retry or dead letter was not acknowledged: its message's offset is not committed."""

    def __init__(self, here: Origin, target: str, error: str) -> None:
        super().__init__(
            f"producing {here.topic}[{here.partition}]@{here.offset} to {target} through the "
            f"proxy failed ({error}); its offset is not committed and the partition is rewound"
        )
        self.origin = here
        self.target = target
        self.error = error


def _headers(msg: Message) -> list[Header]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


@dataclass
class _Sent:
    """One retry or dead letter in flight, and its delivery report."""

    here: Origin
    next: Next
    acked: bool = False
    error: str | None = None

    def report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked = True
        else:
            self.error = f"{err.name()}: {err.str()}"


class RetryingConsumer:
    """A consumer whose failed messages come back later through kdelay (module docstring).

    ``consumer_config`` is a confluent-kafka Consumer config with ``group.id``; the helper sets
    ``enable.auto.commit`` false and refuses a config that sets it true. ``proxy_bootstrap`` is
    the kdelay proxy's Kafka address. ``producer_config`` adds librdkafka producer settings
    (``message.timeout.ms`` defaults to 30 s, under a poll interval). ``create_topics`` creates
    a missing retry or dead-letter topic with as many partitions as the largest of ``topics``.
    """

    def __init__(
        self,
        consumer_config: Mapping[str, Any],
        proxy_bootstrap: str,
        topics: Sequence[str],
        handler: Handler,
        *,
        policy: RetryPolicy | None = None,
        retry_topic: str | None = None,
        dead_letter_topic: str | None = None,
        producer_config: Mapping[str, Any] | None = None,
        batch_size: int = 100,
        create_topics: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        conf, self.group = setup.consumer_config(consumer_config)
        self.topics = list(topics)
        self.retry_topic = retry_topic or f"{self.group}.retry"
        self.dead_letter_topic = dead_letter_topic or f"{self.group}.dlq"
        setup.check_topics(self.topics, self.retry_topic, self.dead_letter_topic)
        if batch_size < 1:
            raise ConfigError(f"batch_size: must be 1 or more, got {batch_size}")
        self.policy = policy or RetryPolicy()
        self._batch_size = batch_size
        self._producer_conf = setup.producer_config(proxy_bootstrap, producer_config or {})
        self._flush_timeout = int(self._producer_conf["message.timeout.ms"]) / 1000 + 5
        self._handler = handler
        self._metrics = setup.metrics_for(registry or REGISTRY)
        self._ok = self._metrics.handled.labels(self.group, "ok")
        self._cooperative = setup.cooperative(conf)
        if create_topics:
            setup.ensure_topics(conf, self.topics, [self.retry_topic, self.dead_letter_topic])
        self._producer = Producer(self._producer_conf)
        self._consumer = Consumer(conf)
        self._consumer.subscribe([*self.topics, self.retry_topic], on_assign=self._on_assign)
        self._closed = False
        log.info("retry.started", group=self.group, topics=self.topics, retry=self.retry_topic)

    # -- the loop ----------------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event | None = None,
        max_messages: int | None = None,
        poll_timeout: float = 1.0,
    ) -> int:
        """Handle messages until ``stop`` is set or ``max_messages`` were handled; the count."""
        total = 0
        while (stop is None or not stop.is_set()) and (
            max_messages is None or total < max_messages
        ):
            limit = self._batch_size if max_messages is None else max_messages - total
            total += self._poll(poll_timeout, min(limit, self._batch_size))
        return total

    def poll_once(self, timeout: float = 1.0) -> int:
        """Handle what one poll returns (up to ``batch_size`` messages); how many were handled.
        Raises RetryProduceError as the module docstring says."""
        return self._poll(timeout, self._batch_size)

    def attempt(self, msg: Message) -> int:
        """Which delivery of its message ``msg`` is: 1 for the first (kdelay.retry.plan)."""
        if msg.topic() != self.retry_topic:
            return 1
        return attempt_of(_headers(msg), from_retry_topic=True)

    def _poll(self, timeout: float, limit: int) -> int:
        done: list[tuple[str, int, int, _Sent | None]] = []
        handler, ok = self._handler, 0
        for msg in take_batch(self._consumer, limit, timeout):
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                log.warning("retry.consume_error", group=self.group, error=err.str())
                continue
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            sent = None
            try:
                handler(msg)
            except Exception as exc:  # noqa: BLE001 - whatever the user's handler raises is retried
                sent = self._fail(msg, Origin(topic, partition, offset), exc)
            else:
                ok += 1
            done.append((topic, partition, offset, sent))
        if ok:
            self._ok.inc(ok)
        sent_all = [s for *_, s in done if s is not None]
        if sent_all and self._producer.flush(self._flush_timeout):
            for s in sent_all:
                if not s.acked and s.error is None:
                    s.error = f"not acknowledged within {self._flush_timeout:.0f} s"
        self._settle(done, sent_all)
        return len(done)

    def _fail(self, msg: Message, here: Origin, exc: Exception) -> _Sent:
        """Produce the retry or dead letter of ``msg``, whose handler raised ``exc``."""
        nxt = next_record(
            self.policy,
            group=self.group,
            retry_topic=self.retry_topic,
            dead_letter_topic=self.dead_letter_topic,
            here=here,
            headers=_headers(msg),
            error=exc,
        )
        sent = _Sent(here, nxt)
        self._produce(msg, sent)
        return sent

    def _produce(self, msg: Message, sent: _Sent) -> None:
        nxt = sent.next
        headers: list[tuple[str, str | bytes | None]] = list(nxt.headers)
        while True:
            try:
                self._producer.produce(
                    nxt.topic, msg.value(), msg.key(), headers=headers, on_delivery=sent.report
                )
            except BufferError:  # the local queue is full: serve delivery reports, try again
                self._producer.poll(0.1)
            except KafkaException as exc:
                sent.error = str(exc)
                return
            else:
                return

    def _settle(self, done: list[tuple[str, int, int, _Sent | None]], sent: list[_Sent]) -> None:
        """Commit each partition up to its first unacknowledged send; rewind to that one."""
        commit: dict[tuple[str, int], int] = {}
        failed: dict[tuple[str, int], _Sent] = {}
        for topic, partition, offset, s in done:
            key = (topic, partition)
            if key in failed:
                continue
            if s is not None and s.error is not None:
                failed[key] = s
            else:
                commit[key] = offset + 1
        for s in sent:
            self._count(s)
        if commit:
            self._commit([TopicPartition(t, p, o) for (t, p), o in commit.items()])
        if not failed:
            return
        for s in failed.values():
            try:
                self._consumer.seek(TopicPartition(s.here.topic, s.here.partition, s.here.offset))
            except KafkaException as exc:  # revoked meanwhile: its next owner starts there
                log.warning("retry.rewind_failed", group=self.group, error=str(exc))
        self._producer.purge()
        self._producer.flush(0)
        self._producer = Producer(self._producer_conf)  # a fresh one after a timeout
        first = next(iter(failed.values()))
        raise RetryProduceError(first.here, first.next.topic, first.error or "")

    def _count(self, s: _Sent) -> None:
        here, nxt = s.here, s.next
        where = {"topic": here.topic, "partition": here.partition, "offset": here.offset}
        if s.error is not None:
            self._metrics.produce_errors.labels(self.group).inc()
            log.warning(
                "retry.produce_failed", group=self.group, to=nxt.topic, error=s.error, **where
            )
            return
        self._metrics.handled.labels(self.group, nxt.kind.value).inc()
        if nxt.kind is Kind.RETRIED:
            self._metrics.retried.labels(self.group).inc()
            log.debug("retry.retried", group=self.group, attempt=nxt.attempt, **where)
        else:
            self._metrics.dead_lettered.labels(self.group).inc()
            log.warning("retry.dead_lettered", group=self.group, attempts=nxt.attempt, **where)

    def _commit(self, offsets: list[TopicPartition]) -> None:
        # A commit that fails (the partition was revoked meanwhile) is not retried: the next
        # owner starts from the last committed offset and handles those messages again.
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("retry.commit_failed", group=self.group, error=str(exc))
            return
        for tp in result:
            if tp.error is not None:
                log.warning("retry.commit_failed", group=self.group, error=tp.error.str())

    # -- group membership and topics ---------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        retry = [p for p in partitions if p.topic == self.retry_topic]
        if not retry:
            return  # librdkafka assigns them as they are
        try:
            committed = consumer.committed(retry, timeout=30)
        except KafkaException as exc:
            log.warning("retry.committed_unknown", group=self.group, error=str(exc))
            return
        known = {(c.topic, c.partition) for c in committed if c.offset >= 0}
        for p in retry:
            if (p.topic, p.partition) not in known:
                p.offset = OFFSET_BEGINNING
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group. Nothing is pending: every poll waited for its retries."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        finally:
            self._producer.flush(1)

    def __enter__(self) -> RetryingConsumer:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
