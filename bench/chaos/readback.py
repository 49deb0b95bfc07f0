"""Every target topic (and the dead-letter topic) read back read_committed, from the start,
into :class:`bench.chaos.history.Delivery` rows while the run goes on.

The token is the payload the run wrote (``chaos|<token>``), so nothing of kdelay's headers is
needed but ``kdelay-occurrence``, a series' occurrence number (CONTRACT.md, v2 additions).
Records of other payloads (a cancel is delivered nowhere; nothing else writes there) are
counted as tokens of their own, so the checker reports them as phantoms.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, IsolationLevel, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec  # not re-exported in the stubs

from bench.chaos.history import Delivery
from bench.chaos.operations import PAYLOAD

OCCURRENCE = "kdelay-occurrence"


class Reader:
    """A thread consuming ``topics`` (``dead_letter`` marked as such) until :meth:`stop`."""

    def __init__(self, bootstrap: str, topics: list[str], dead_letter: str) -> None:
        self.bootstrap, self.topics, self.dead_letter = bootstrap, topics, dead_letter
        self.lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.last_ms = 0.0
        #: Consumer errors by name (a stalled partition's cause, when it has one).
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def snapshot(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "chaos-reader",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 0,
            }
        )
        try:
            meta = consumer.list_topics(timeout=30).topics
            consumer.assign(
                [
                    TopicPartition(t, p, OFFSET_BEGINNING)
                    for t in [*self.topics, self.dead_letter]
                    for p in meta[t].partitions
                ]
            )
            while not self._stop.is_set():
                for msg in consumer.consume(500, 0.5):
                    err = msg.error()
                    if err is not None:
                        with self.lock:
                            self.errors[err.name()] = self.errors.get(err.name(), 0) + 1
                        continue
                    self._add(msg)
        finally:
            consumer.close()

    def _add(self, msg: Message) -> None:
        topic = msg.topic() or ""
        value = msg.value() or b""
        headers = dict(msg.headers() or [])
        text = value.decode(errors="replace")
        token = text.removeprefix(PAYLOAD) if text.startswith(PAYLOAD) else f"other:{text[:60]}"
        occ = headers.get(OCCURRENCE)
        row = Delivery(
            token,
            topic,
            msg.partition() or 0,
            msg.offset() or 0,
            msg.timestamp()[1],
            int(occ) if occ else None,
            topic == self.dead_letter,
        )
        with self.lock:
            self.deliveries.append(row)
            self.last_ms = time.time() * 1000


def partition_ends(bootstrap: str, topics: list[str], read: list[Delivery]) -> dict[str, Any]:
    """Per target partition: the end a read_committed reader may reach (the last stable offset),
    the log end, and the reader's last offset + 1: an LSO far behind the log end long after the
    run says a transaction is still open there, so what follows it is invisible to
    read_committed consumers (a diagnosis for a run with ``lost`` violations)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(timeout=30).topics
    parts = [TopicPartition(t, p) for t in topics for p in sorted(meta[t].partitions)]
    ends: dict[str, Any] = {}
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    for level, name in (
        (IsolationLevel.READ_COMMITTED, "lso"),
        (IsolationLevel.READ_UNCOMMITTED, "end"),
    ):
        futures = admin.list_offsets(
            dict.fromkeys(parts, latest), isolation_level=level, request_timeout=30
        )
        for tp, fut in futures.items():
            ends.setdefault(f"{tp.topic}[{tp.partition}]", {})[name] = fut.result().offset
    for d in read:
        row = ends.get(f"{d.topic}[{d.partition}]")
        if row is not None:
            row["read"] = max(row.get("read", 0), d.offset + 1)
    return ends


def read_again(
    bootstrap: str,
    topics: list[str],
    dead_letter: str,
    *,
    quiet_s: float = 5.0,
    cap_s: float = 120.0,
) -> list[Delivery]:
    """Every target once more, by a fresh consumer from the start, until nothing came for
    ``quiet_s``: what the checker judges does not depend on the run-long reader's session
    having survived every fault (a stalled reader would read as losses)."""
    reader = Reader(bootstrap, topics, dead_letter)
    reader.start()
    start = time.time()
    while time.time() - start < cap_s:
        time.sleep(1.0)
        if time.time() - max(start, reader.last_ms / 1000) > quiet_s:
            break
    reader.stop()
    return reader.snapshot()


def merged(*reads: list[Delivery]) -> tuple[list[Delivery], int]:
    """The union of several reads by position, and how many the first one lacked."""
    rows: dict[tuple[str, int, int], Delivery] = {}
    for read in reads:
        for d in read:
            rows.setdefault((d.topic, d.partition, d.offset), d)
    return list(rows.values()), len(rows) - len(
        {(d.topic, d.partition, d.offset) for d in reads[0]}
    )
