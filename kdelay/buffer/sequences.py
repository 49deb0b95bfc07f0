"""Producer-sequence stamps (route field ``q``): which idempotent producer sent a buffer record
to which topic-partition, and its sequence number there (KIP-98). The proxy's Kafka listener
writes them (proxy/routing/route.py); the replicas' cancel rule compares them
(``cancel_rule.produced_before``); the format is here, apart from the rule, so that readers
that judge by their own reading of the contract (the verifier) can parse it too.

Functions of their arguments; safe from any thread.
"""

from __future__ import annotations

import re

#: Kafka's sequence numbers wrap at int32 (KIP-98).
SEQUENCES = 2**31
#: ``<producer id>/<epoch>/<partition>/<sequence>/<topic>``: the topic last, a topic name has
#: no ``/`` but it is the one free-form part.
_STAMP = re.compile(r"(\d{1,19})/(\d{1,5})/(\d{1,10})/(\d{1,10})/([^/]{1,255})", re.ASCII)


def producer_seq(producer_id: int, epoch: int, topic: str, partition: int, sequence: int) -> str:
    """The stamp of a record that an idempotent producer (``producer_id``, ``epoch``) sent to
    ``topic``/``partition`` with sequence number ``sequence``: the order in which that producer
    produced its records to that partition, which a Produce request, librdkafka's split of a
    flush, a retry or the order of the proxy's writes never changes."""
    return f"{producer_id}/{epoch}/{partition}/{sequence % SEQUENCES}/{topic}"


def parse_stamp(stamp: object) -> tuple[str, int] | None:
    """``(producer stream, sequence)`` of a well-formed stamp, the stream naming producer id,
    epoch, partition and topic; None for anything else."""
    m = _STAMP.fullmatch(stamp) if isinstance(stamp, str) else None
    if m is None or int(m[4]) >= SEQUENCES:
        return None
    return f"{int(m[1])}/{int(m[2])}/{int(m[3])}/{m[5]}", int(m[4])


def valid_producer_seq(stamp: object) -> str | None:
    """``stamp`` when it is a well-formed :func:`producer_seq` stamp, else None (ignored: the
    record then follows the rule of unstamped records)."""
    return stamp if isinstance(stamp, str) and parse_stamp(stamp) is not None else None
