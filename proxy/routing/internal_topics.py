"""Topics no client writes through the proxy: kdelay's own (``__kdelay*``) and Kafka's.

A record produced to ``__kdelay_buffer`` and taken in would have the buffer topic as its target:
the master would later release it *into* the buffer, and every replica would log it as invalid.
So internal topics are refused on every path, for immediate and delayed records alike:
``routing.route`` (which serves the Kafka listener and the HTTP API) raises
:class:`RefusedTopicError`, which the Kafka listener answers with ``TOPIC_AUTHORIZATION_FAILED``
and the HTTP API with 403, each with a message naming the rule. The Kafka listener also refuses
them before looking the topic up (so a missing ``__kdelay_x`` is not auto-created upstream by a
Metadata request), and leaves them out of Metadata.

One exception keeps ``kdelay cancel`` working: a *cancel* (a record whose control header is
``kdelay-cancel``) may be addressed to ``__kdelay_buffer``. A cancel is written to the buffer
topic whatever topic carried it, and the buffer topic is the one topic the command can count on
existing. Anything else addressed to it is refused.

Pure functions; safe from any thread.
"""

from __future__ import annotations

from typing import Final

from kdelay.buffer import BUFFER_TOPIC
from kdelay.errors import KdelayError
from kdelay.headers import CANCEL

#: Every topic kdelay creates starts with it (buffer, dead letters, checkpoint, clock, shards).
KDELAY_PREFIX: Final = "__kdelay"
#: Kafka's own topics (consumer offsets, transactions, share groups, tiered storage, KRaft).
KAFKA_INTERNAL: Final = frozenset(
    {
        "__consumer_offsets",
        "__transaction_state",
        "__share_group_state",
        "__remote_log_metadata",
        "__cluster_metadata",
    }
)
#: The topic a cancel may be addressed to (see the module docstring).
CANCEL_CARRIER: Final = BUFFER_TOPIC


class RefusedTopicError(KdelayError):
    """Records for an internal topic: nothing of the batch is written. ``rule`` says why the
    topic is refused; ``index`` is the record at fault when the topic is refused only for some
    records (the cancel carrier), and the message then names it."""

    def __init__(self, topic: str, rule: str, index: int | None = None) -> None:
        super().__init__(rule if index is None else f"record {index}: {rule}")
        self.topic = topic
        self.rule = rule
        self.index = index


def refusal(topic: str) -> str | None:
    """Why ``topic`` may not be written through the proxy (naming the rule), or None."""
    if topic.startswith(KDELAY_PREFIX):
        return (
            f"topic {topic!r} is internal to kdelay: topics named {KDELAY_PREFIX}* are written "
            "by kdelay only; produce to your own topic with kdelay headers"
        )
    if topic in KAFKA_INTERNAL:
        return f"topic {topic!r} is internal to Kafka: the kdelay proxy does not write it"
    return None


def check(topic: str) -> str | None:
    """Raise RefusedTopicError when no record may go to ``topic``; for the cancel carrier,
    return why its non-cancel records are refused (``route`` decides per record)."""
    why = refusal(topic)
    if why is not None and topic != CANCEL_CARRIER:
        raise RefusedTopicError(topic, why)
    return why


def carrier_refusal(topic: str, index: int, why: str) -> RefusedTopicError:
    """The error for record ``index`` of a batch for the cancel carrier that is no cancel."""
    return RefusedTopicError(topic, f"{why} (only a {CANCEL} record may be sent to it)", index)


def visible(topic: str) -> bool:
    """Whether a Metadata answer lists ``topic`` (refused topics, bar the carrier, are hidden)."""
    return topic == CANCEL_CARRIER or refusal(topic) is None
