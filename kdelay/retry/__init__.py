"""The consumer retry helper: RocketMQ's RECONSUME_LATER and Pulsar's negative-ack redelivery
delay for a confluent-kafka consumer, the delay kept by kdelay (docs/retry.md).

    from kdelay.retry import RetryingConsumer, RetryPolicy

    def handle(msg: Message) -> None: ...  # raise to have the message retried later

    consumer = RetryingConsumer(
        {"bootstrap.servers": KAFKA, "group.id": "billing"}, PROXY, ["orders"], handle,
        policy=RetryPolicy(delays_ms=[1_000, 10_000, 60_000]),
    )
    consumer.run(stop_event)

The public API is what this package exports (``__all__``); its modules are

- :mod:`kdelay.retry.consumer`: :class:`RetryingConsumer`, its loop and its commit rule (a
  message's offset is committed only once its retry or dead letter is acknowledged);
- :mod:`kdelay.retry.plan`: pure logic, what is produced after a failed delivery (the retry
  or dead-letter record and its headers) and the :class:`RetryPolicy`;
- :mod:`kdelay.retry.setup`: the consumer and producer settings checked, the retry and
  dead-letter topics, the ``kdelay_retry_*`` metrics.

Threads: as :mod:`kdelay.retry.consumer` says (one thread drives a consumer).
"""

from __future__ import annotations

from kdelay.retry.consumer import Handler, RetryingConsumer, RetryProduceError

# Importable from kdelay.retry before it became a package (kdelay/retry.py imported them): kept
# importable from here. The API is ``__all__``.
from kdelay.retry.plan import Header as Header
from kdelay.retry.plan import Kind as Kind
from kdelay.retry.plan import Next as Next
from kdelay.retry.plan import Origin, RetryPolicy
from kdelay.retry.plan import attempt_of as attempt_of
from kdelay.retry.plan import next_record as next_record

__all__ = ["Handler", "Origin", "RetryPolicy", "RetryProduceError", "RetryingConsumer"]
