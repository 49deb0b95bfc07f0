"""A proxy killed mid-stream, five times: an idempotent producer's retries create no second
delayed message and lose none.

Records without ``kdelay-id`` get ids derived from (producer id, epoch, topic, partition,
sequence), so a batch the client retries through the restarted proxy writes the same buffer
keys, and the replicas keep one copy, even when the first copy was delivered already.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from dev.stack import wait_until
from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.proxies import proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

KILLS = 5
RATE = 200  # delayed messages a second


@dataclass
class KillRun:
    """What a producer and a reader saw while the proxy was killed ``KILLS`` times."""

    acked: set[bytes] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    @property
    def counts(self) -> Counter[bytes]:
        return Counter(r.value or b"" for r in self.records)

    @property
    def dupes(self) -> dict[bytes, int]:
        return {v: n for v, n in self.counts.items() if n > 1}


def _kill_proxy_while_sending(
    bootstrap: str, target: str, tmp_path: Path, *, delayed: bool, ready: Callable[[], None]
) -> KillRun:
    """Send to ``target`` through a proxy subprocess and SIGKILL it ``KILLS`` times, each time
    restarting it on the same port; then read ``target`` until everything acknowledged came."""
    proxy, port = proxy_process(bootstrap, tmp_path / "proxy.log")
    run = KillRun()
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            run.acked.add(msg.value() or b"")
        else:
            run.failed.append(err.str())

    def send() -> None:
        producer = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{port}",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 180_000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        i = 0
        while not stop.is_set():
            # Delays of 0.5-3 s: many fall due during a restart, before a retry arrives.
            delay: list[tuple[str, str | bytes | None]] = (
                [(h.DELAY_MS, str(500 + (i * 37) % 2_500).encode())] if delayed else []
            )
            producer.produce(
                target, f"m-{i}".encode(), partition=i % 2, headers=delay, on_delivery=on_delivery
            )
            producer.poll(0)
            i += 1
            time.sleep(1 / RATE)  # sleep: the sending rate, not a synchronisation
        assert producer.flush(180) == 0, "records still unacknowledged after 180 s"

    def under_way() -> None:
        """Until 2 s of the stream more were acknowledged (by this proxy): some of it due,
        some in flight."""
        acked = len(run.acked)
        wait_until(
            lambda: len(run.acked) >= acked + 2 * RATE,
            timeout=60,
            what=f"{2 * RATE} more acknowledgements through the proxy",
        )

    proxy.start()
    try:
        wait_accepting(port)
        ready()
        sender = threading.Thread(target=send, name="sender")
        sender.start()
        try:
            for _ in range(KILLS):
                under_way()
                proxy.kill()
                time.sleep(0.5)  # sleep: the outage's length, not a synchronisation
                proxy.restart()
                wait_accepting(port)
            under_way()
        finally:
            stop.set()
            sender.join(240)
        assert not sender.is_alive()
    finally:
        proxy.stop()
    consume_until(bootstrap, [target], lambda rs: run.acked <= {r.value for r in rs}, timeout=120)
    end = time.monotonic() + 5  # anything that would wrongly follow has its chance
    run.records = consume_until(bootstrap, [target], lambda _r: time.monotonic() > end)
    print(
        f"\n{KILLS} proxy kills ({'delayed' if delayed else 'immediate'}): {len(run.acked)} "
        f"acknowledged, {len(run.counts)} delivered, {len(run.dupes)} duplicated "
        f"({sum(run.dupes.values()) - len(run.dupes)} extra copies), {len(run.failed)} failed sends"
    )
    assert run.acked, "nothing was acknowledged"
    assert run.acked <= set(run.counts), f"{len(run.acked - set(run.counts))} acked, not delivered"
    # A send that failed (or was not acknowledged) may still have been written.
    assert len(set(run.counts) - run.acked) <= len(run.failed)
    return run


def test_five_proxy_kills_lose_and_duplicate_no_delayed_message(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    target = unique_topic("px-kill")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    with ReplicaSet(
        tmp_path, kafka.bootstrap_servers, zookeeper.connect, buffer_topic=BUFFER_TOPIC
    ) as rs:

        def replicas_ready() -> None:
            rs.start_all()
            rs.wait_master(timeout=90)

        run = _kill_proxy_while_sending(
            kafka.bootstrap_servers, target, tmp_path, delayed=True, ready=replicas_ready
        )
    assert not run.dupes, f"duplicated: {list(run.dupes.items())[:5]}"
    assert_not_early(run.records)


def test_five_proxy_kills_lose_no_immediate_record(kafka: KafkaInfra, tmp_path: Path) -> None:
    """The immediate path is at-least-once across a proxy crash: the restarted proxy writes a
    retried batch with its own upstream producer, so a batch written before the crash but not
    acknowledged is written again (README "Guarantees"). Measured, not hidden: the count is
    printed; nothing may be lost."""
    target = unique_topic("px-kill-now")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    run = _kill_proxy_while_sending(
        kafka.bootstrap_servers, target, tmp_path, delayed=False, ready=lambda: None
    )
    # At most the batches in flight at each kill: 5 per partition (librdkafka's
    # max.in.flight with idempotence), each of at most RATE * linger records, so well below
    # what one second of the stream holds.
    assert sum(run.dupes.values()) - len(run.dupes) <= KILLS * RATE
