"""The least a releaser does on plain Kafka: the floor under kdelay's release lateness.

``bench.delay_service`` runs it beside each of its lateness runs and its burst due at once
(``--floor``, the default), so kdelay's figures compare with what this machine's Kafka allows
any releaser, measured in the same run. The releaser runs in a process of its own, without
kdelay: message ``i`` of ``n`` is due at ``start + i / rate`` (a burst: ``rate`` is
:data:`BURST`), so the schedule is a formula (no ingest, no store, no scan), and its loop is the
master's round with nothing else in it:

- exactly-once: take everything due (at most ``scan_batch``'s default a round), then
  ``begin_transaction``, produce each record to the target, wait for the acknowledgements,
  produce one checkpoint record, ``commit_transaction``, as kdelay's round does
  (``delay_service/release/exactly_once.py``), whose extra work is the store, the ingest beside it
  and the outcome of each release;
- at-least-once: produce what is due with an idempotent producer and wait for the
  acknowledgements before the next round, as kdelay's round does: a target with records in
  flight is held, so that a retried record is never overtaken (DESIGN.md, "order is kept");
  ``ordered=False`` (``bench.delay_service --no-ordered-floor``) never waits: the least any
  producer does, with no such order.

The same producer settings as kdelay's master (acks=all, ``linger.ms`` 2). The bench's reader
reads the target read_committed (librdkafka's default) and measures lateness as for kdelay:
the record's timestamp (set when it is produced) and the moment of receipt, each minus the due
time.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from confluent_kafka import Producer

from bench.harness.replicas import PARTITIONS
from dev.kafka_tools import create_topic
from kdelay.delay_service.config import DELIVERY_MODES, EXACTLY_ONCE

#: Most records a round releases: kdelay's default ``scan_batch``.
ROUND_LIMIT = 10_000
#: A rate at which every message of a burst is due within the same millisecond.
BURST = 10**9


@dataclass(frozen=True)
class Schedule:
    """``n`` messages for ``topic``, message ``i`` due at ``start`` (epoch seconds) ``+ i /
    rate``, released in ``mode`` with a checkpoint record to ``checkpoints`` each round."""

    bootstrap: str
    topic: str
    checkpoints: str
    rate: int
    n: int
    start: float
    mode: str
    round_limit: int
    ordered: bool


def _release(s: Schedule) -> None:
    """The releaser (a child process)."""
    bootstrap, topic, checkpoints, rate, n, start, mode, limit, ordered = (
        s.bootstrap, s.topic, s.checkpoints, s.rate, s.n, s.start, s.mode, s.round_limit,
        s.ordered)  # fmt: skip
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 2, "acks": "all"}
    if mode == EXACTLY_ONCE:
        conf["transactional.id"] = f"bench-floor-{uuid.uuid4().hex[:8]}"
    else:
        conf["enable.idempotence"] = True
    p = Producer(conf)
    if mode == EXACTLY_ONCE:
        p.init_transactions(30)
    sent = 0
    while sent < n:
        now = time.time()
        due = min(n, int((now - start) * rate) + 1, sent + limit) if now >= start else 0
        if due <= sent:
            # sleep to the next due time, at most 10 ms, as a master sleeps to its next due
            p.poll(min(0.01, max(0.0, start + sent / rate - now)))
            continue
        if mode == EXACTLY_ONCE:
            p.begin_transaction()
        for i in range(sent, due):
            due_ms = int((start + i / rate) * 1000)
            p.produce(topic, b"v", partition=i % PARTITIONS,
                      headers=[("kdelay-deliver-at", str(due_ms).encode())])  # fmt: skip
        sent = due
        if mode == EXACTLY_ONCE:
            p.flush(30)  # the round's acknowledgements
            p.produce(checkpoints, b"checkpoint", key=b"floor")
            p.commit_transaction(30)
        elif ordered:
            p.flush(30)  # the round's acknowledgements: nothing overtakes a retried record
        else:
            p.poll(0)
    p.flush(30)


class Floor:
    """The releaser of one floor run, started as a child process: start the reader first
    (it must be fetching before the first message is due), then :meth:`start` this."""

    def __init__(self, bootstrap: str, rate: int, n: int, delay_ms: int,
                 mode: str = EXACTLY_ONCE, *, round_limit: int = ROUND_LIMIT,
                 ordered: bool = True) -> None:  # fmt: skip
        if mode not in DELIVERY_MODES:
            raise ValueError(f"--delivery: one of {', '.join(DELIVERY_MODES)}, not {mode!r}")
        self.bootstrap, self.rate, self.delay_ms, self.mode = bootstrap, rate, delay_ms, mode
        self.n, self.round_limit, self.ordered = n, round_limit, ordered
        self.topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
        self.checkpoints = f"{self.topic}-checkpoints"
        create_topic(bootstrap, self.topic, PARTITIONS)
        create_topic(bootstrap, self.checkpoints, 1, config={"cleanup.policy": "compact"})
        self._proc: BaseProcess | None = None

    def start(self) -> None:
        start = time.time() + self.delay_ms / 1000
        schedule = Schedule(self.bootstrap, self.topic, self.checkpoints, self.rate, self.n,
                            start, self.mode, self.round_limit, self.ordered)  # fmt: skip
        proc = multiprocessing.get_context("spawn").Process(
            target=_release, args=(schedule,), daemon=True
        )
        proc.start()
        self._proc = proc

    def join(self, timeout: float) -> None:
        assert self._proc is not None
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            self._proc.kill()
            raise TimeoutError(f"the floor's releaser of {self.topic} ran past {timeout:.0f} s")
        if self._proc.exitcode != 0:
            raise RuntimeError(f"the floor's releaser exited with {self._proc.exitcode}")
