"""A proxy killed mid-stream, five times: an idempotent producer's retries create no second
delayed message and lose none (issue 11).

Records without ``kdelay-id`` get ids derived from (producer id, epoch, topic, partition,
sequence), so a batch the client retries through the restarted proxy writes the same buffer
keys, and the replicas keep one copy, even when the first copy was delivered already.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from kdelay import headers as h
from kdelay.buffer import BUFFER_TOPIC
from kdelay.local import wait_until
from kdelay.local.process import ManagedProcess, free_port
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import consume_until, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target

KDELAY = str(Path(sys.executable).with_name("kdelay"))
KILLS = 5
RATE = 200  # delayed messages a second


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_five_proxy_kills_lose_and_duplicate_no_delayed_message(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    target = unique_topic("px-kill")
    create_target(kafka.bootstrap_servers, target, partitions=2)
    port = free_port()
    argv = [
        KDELAY, "proxy", "--listen", f"127.0.0.1:{port}",
        "--http-listen", f"127.0.0.1:{free_port()}",
        "--bootstrap-servers", kafka.bootstrap_servers,
    ]  # fmt: skip
    proxy = ManagedProcess("proxy", argv, tmp_path / "proxy.log")
    acked: set[bytes] = set()
    failed: list[str] = []
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked.add(msg.value() or b"")
        else:
            failed.append(err.str())

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
            value = f"m-{i}".encode()
            delay = str(500 + (i * 37) % 2_500).encode()  # 0.5-3 s: many due during a restart
            producer.produce(
                target,
                value,
                partition=i % 2,
                headers=[(h.DELAY_MS, delay)],
                on_delivery=on_delivery,
            )
            producer.poll(0)
            i += 1
            time.sleep(1 / RATE)
        assert producer.flush(180) == 0, "records still unacknowledged after 180 s"

    with ReplicaSet(
        tmp_path, kafka.bootstrap_servers, zookeeper.connect, buffer_topic=BUFFER_TOPIC
    ) as rs:
        proxy.start()
        wait_until(lambda: _accepting(port), timeout=60, what="the proxy to listen")
        rs.start_all()
        rs.wait_master(timeout=90)
        sender = threading.Thread(target=send, name="sender")
        sender.start()
        try:
            for _ in range(KILLS):
                time.sleep(2.0)  # a stream under way, some of it due, some in flight
                proxy.kill()
                time.sleep(0.5)
                proxy.restart()
                wait_until(lambda: _accepting(port), timeout=60, what="the proxy to listen again")
            time.sleep(2.0)
        finally:
            stop.set()
            sender.join(240)
            proxy.stop()
        assert not sender.is_alive()
        records = consume_until(
            kafka.bootstrap_servers,
            [target],
            lambda rs_: acked <= {r.value for r in rs_},
            timeout=120,
        )
        end = time.monotonic() + 5  # anything that would wrongly follow has its chance
        records = consume_until(
            kafka.bootstrap_servers, [target], lambda _r: time.monotonic() > end
        )
    counts = Counter(r.value or b"" for r in records)
    dupes = {v: n for v, n in counts.items() if n > 1}
    print(f"\n{KILLS} proxy kills: {len(acked)} acknowledged, {len(counts)} delivered, "
          f"{len(dupes)} duplicated, {len(failed)} failed sends")  # fmt: skip
    assert acked, "nothing was acknowledged"
    assert acked <= set(counts), f"{len(acked - set(counts))} acknowledged, never delivered"
    assert not dupes, f"duplicated: {list(dupes.items())[:5]}"
    assert_not_early(records)
    unacked_delivered = set(counts) - acked
    # A send that failed (or was not acknowledged) may still have been written once.
    assert len(unacked_delivered) <= len(failed)
