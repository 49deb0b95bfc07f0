"""The buffer-record contract: how a delayed message is stored in the buffer topic.

The delay service owns this format; the proxy writes it, the replicas and the verifier read it.

Buffer topic ``__kdelay_buffer``: compacted, ``message.timestamp.type=LogAppendTime`` (a delay
counts from the broker's append time, so every replica computes the same due time whatever the
proxy's clock says). Three kinds of record, told apart by the routing header, which is always
the *last* header and is named ``kdelay-route``; its value is compact JSON.

Format version 2 (written). Record key = the *buffer key* of that one record: unique per
scheduled message and per cancel (32 hex characters; derived from the producer id, epoch,
partition and sequence of an idempotent producer's record, so a retried batch writes the same
keys and replicas drop the copy; random otherwise). The proxy chooses the partition itself, by
:func:`partition_for` of the *message id*, so a message, its cancel and any later message that
reuses the id are in one partition, in production order (an id the proxy made up for a message
sent without one is pinned to its target partition's buffer partition, :func:`pinned_id`).
Compaction then only ever removes a record whose own tombstone was written, never a later
message that reuses its id.

- schedule: value = the original value (``b""`` when it was null, flagged by ``"n": true``, so
  that a null-valued message is never mistaken for a compaction tombstone); headers = the
  producer's own headers minus the control headers, then ``kdelay-route`` =
  ``{"v": 2, "op": "schedule", "i": id, "t": topic, "p": partition (-1: by key), "k": base64
  key or null, "n": value was null, "d": deliver-at epoch ms or null, "r": delay ms after the
  record's (append) timestamp or null, "s": order}``. Exactly one of ``d`` and ``r`` is set.
  ``s`` orders messages due at the same millisecond: the proxy's acceptance order. A
  recurring message (``kdelay/repeat.py``) adds ``"rp": its canonical kdelay-repeat value,
  "oc": occurrence number (1, 2, ...)``; the delay service writes occurrence n+1 when it
  releases occurrence n, with the same id, ``s`` and content, buffer key ``<key of
  occurrence 1>#<n+1>`` and an absolute ``d``. A replace (``kdelay-replace: true``) adds
  ``"rx": true``: it is also a cancel of its id (:func:`cancels`, with its own offset and
  append time; never of its own series' later occurrences, :func:`own_series`), and then
  pending itself; readers that predate it see a plain schedule.
  A record an idempotent producer sent through the proxy's Kafka listener adds ``"q":
  "<producer id>/<epoch>/<partition>/<sequence>/<topic>"`` (:func:`producer_seq`; a cancel
  too): when a schedule and a cancel of one id carry the same producer, epoch, topic and
  partition, their sequence numbers decide (:func:`cancels`, :func:`produced_before`).
  Readers that predate ``q`` ignore it (the rule by offsets and times).
  Behind an authenticating proxy a schedule adds ``"w": its owner`` (the principal that
  scheduled it, Kafka's form ``"User:alice"``), and a replace by a kdelay administrator
  ``"a": true``.
- cancel: value ``b""``; ``kdelay-route`` = ``{"v": 2, "op": "cancel", "i": id}``: cancels
  every message with that id produced before it, and one sent with it but appended after it
  (:func:`cancels`). Behind an authenticating proxy it adds ``"w": the principal that sent
  it`` and, for a kdelay administrator (ALTER on the buffer topic), ``"a": true``: it then
  cancels only messages that principal owns, any when ``a``, and those without an owner
  (:func:`may_cancel`). Readers that predate ``w`` and ``a`` ignore them.
- bulk cancel: a cancel whose ``kdelay-route`` adds ``"px": id prefix`` (never empty) and
  optionally ``"t": target topic``; ``i`` is then the bulk cancel's own id, which no message
  has (``bulk_ids.py``). The proxy writes one copy in every buffer partition, id
  ``bulk.p<N>.<32 hex>``: the copy in partition ``q`` cancels each pending message of partition
  ``q`` whose id starts with ``px`` (and whose target is ``t``), appended no later than the copy
  itself (by LogAppendTime), and that its sender may cancel (:func:`may_cancel`); nothing
  appended after it. An older proxy's ``bulk.<32 hex>`` (one record per shard) applies to every
  partition of the store that reads it. Readers that predate ``px`` see a cancel of an id no
  message has: a no-op.
- tombstone: value null, key = the buffer key of the record it retires; ``kdelay-route`` =
  ``{"v": 2, "op": "done", "i": id, "o": buffer offset of that record}``, plus, when the
  master knows what became of the message, ``"x": "delivered" | "dead_lettered" |
  "cancelled", "t": target topic, "tp": partition written to, "to": offset there, "ts": release
  time, "d": due time, "oc": occurrence`` (what ``GET /v1/messages/{id}`` reports).

Version 1 (read only): key = the message id; no ``i``, ``r``, ``s``; ``d`` always set.

The package exports the whole contract (``__all__``); its modules: :mod:`.records` the record
values, :mod:`.codec` the wire format (:func:`encode`, :func:`decode`, the route header's fields
and their Spark DDL, :func:`route_schema`), :mod:`.partitions` an id's buffer partition,
:mod:`.cancel_rule` which schedules a cancel cancels (:func:`cancels`), :mod:`.sequences` the
producer-sequence stamps (route field ``q``).
"""

from __future__ import annotations

from kdelay.buffer.cancel_rule import (
    CANCEL_SENT_WITH_MS,
    CANCEL_WINDOW_MS,
    ORDER_SHIFT,
    accepted_ms,
    cancels,
    may_cancel,
    own_series,
    produced_before,
)
from kdelay.buffer.codec import (
    BUFFER_TOPIC,
    DEAD_LETTER_TOPIC,
    FORMAT_VERSION,
    I64_RANGE,
    MAX_ID_BYTES,
    OP_CANCEL,
    OP_DONE,
    OP_SCHEDULE,
    READ_VERSIONS,
    ROUTE_FIELDS,
    ROUTE_HEADER,
    Encoded,
    decode,
    encode,
    encode_schedule,
    route_schema,
    tombstone_route,
)
from kdelay.buffer.partitions import partition_for, pinned_id, target_pin
from kdelay.buffer.records import BufferRecord, Cancel, Fate, Scheduled, Tombstone
from kdelay.buffer.sequences import parse_stamp, producer_seq, valid_producer_seq

__all__ = [
    "BUFFER_TOPIC",
    "CANCEL_SENT_WITH_MS",
    "CANCEL_WINDOW_MS",
    "DEAD_LETTER_TOPIC",
    "FORMAT_VERSION",
    "I64_RANGE",
    "MAX_ID_BYTES",
    "OP_CANCEL",
    "OP_DONE",
    "OP_SCHEDULE",
    "ORDER_SHIFT",
    "READ_VERSIONS",
    "ROUTE_FIELDS",
    "ROUTE_HEADER",
    "BufferRecord",
    "Cancel",
    "Encoded",
    "Fate",
    "Scheduled",
    "Tombstone",
    "accepted_ms",
    "cancels",
    "decode",
    "encode",
    "encode_schedule",
    "may_cancel",
    "own_series",
    "parse_stamp",
    "partition_for",
    "pinned_id",
    "produced_before",
    "producer_seq",
    "route_schema",
    "target_pin",
    "tombstone_route",
    "valid_producer_seq",
]
