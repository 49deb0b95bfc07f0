"""The README's cancel example, exactly, through a real proxy to real replicas: a message with a
key and an id, then its ``kdelay-cancel`` without a key, twenty times, one ``flush``.

The proxy writes a request's cancels after its other records, so a message in the same request
as its cancel precedes it; librdkafka still spreads one flush over several requests, so some
cancels reach the buffer topic *before* their message. Such a message is cancelled when a proxy
accepted it within ``CANCEL_SENT_WITH_MS`` of the cancel's append (broker clock), and is a new
message otherwise (it came in a request the client sent after the cancel's answer, which the
proxy cannot tell from a reschedule). The replicas, master and follower alike, deliver exactly
the messages this rule leaves, and a message without a cancel.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from dev.stack import wait_until
from kdelay import buffer
from kdelay.buffer import BUFFER_TOPIC, Cancel, Scheduled
from kdelay.errors import InfrastructureError
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.kafka_helpers import Record, consume_until, decode_buffer, unique_topic
from tests.support.proxies import proxy_process, wait_accepting
from tests.support.replicas import ReplicaSet
from tests.support.schedule import assert_not_early, create_target, delivered_ids

PAIRS = 20
ROUNDS = 3


def _about(records: list[Record], ids: set[str]) -> dict[str, list[tuple[Record, object]]]:
    """Per id of ``ids``, its schedules and cancels (raw and decoded), in buffer order."""
    out: dict[str, list[tuple[Record, object]]] = {i: [] for i in ids}
    for r in records:
        decoded = decode_buffer(r)
        if isinstance(decoded, Scheduled | Cancel) and decoded.id in ids:
            out[decoded.id].append((r, decoded))
    return out


def _state(doc: dict[str, object] | None) -> object:
    return None if doc is None else doc.get("state")


def readme_example(port: int, topic: str, ids: list[str], failures: list[KafkaError]) -> None:
    """The README's example (a 3 s delay instead of 30 minutes), once per id, one flush."""

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    for i, msg_id in enumerate(ids):
        p.produce(
            topic,
            b"timeout",
            key=f"order-{i}".encode(),
            headers=[("kdelay-delay-ms", b"3000"), ("kdelay-id", msg_id.encode())],
            on_delivery=on_delivery,
        )
        p.produce(
            topic,
            b"",
            headers=[("kdelay-cancel", msg_id.encode())],  # changed our mind
            on_delivery=on_delivery,
        )
    assert p.flush(60) == 0


def test_the_readme_cancel_example_cancels_all_twenty(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("orders")
    create_target(bs, topic, partitions=6)  # keyed messages and keyless cancels part ways
    run = uuid.uuid4().hex[:8]
    # Three runs of the example: the keyless cancels of one producer share a partition, which
    # a request may list after every message's (then no cancel comes first).
    rounds = [[f"order-{i}-timeout-{run}-{n}" for i in range(PAIRS)] for n in range(ROUNDS)]
    ids = [msg_id for one in rounds for msg_id in one]
    control = f"order-control-timeout-{run}"
    failures: list[KafkaError] = []
    with ReplicaSet(tmp_path, bs, zookeeper.connect, count=2, buffer_topic=BUFFER_TOPIC) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        proxy, port = proxy_process(bs, tmp_path / "proxy.log")
        proxy.start()
        try:
            wait_accepting(port)
            for one in rounds:
                readme_example(port, topic, one, failures)
            # The control: the same message without a cancel.
            p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
            p.produce(
                topic,
                b"timeout",
                key=b"order-control",
                headers=[("kdelay-delay-ms", b"3000"), ("kdelay-id", control.encode())],
            )
            assert p.flush(60) == 0
        finally:
            proxy.stop()
        assert failures == [], failures[:3]

        mine = set(ids) | {control}
        buffered = consume_until(
            bs,
            [BUFFER_TOPIC],
            lambda rs_: sum(map(len, _about(rs_, mine).values())) >= 2 * len(ids) + 1,
            timeout=60,
        )
        about = _about(buffered, mine)
        reordered = 0
        due = 0
        expected_new: set[str] = set()  # what the rule calls a new message: sent after it
        for msg_id in ids:
            (r1, d1), (r2, d2) = about[msg_id]
            assert r1.partition == r2.partition  # every record about an id: one partition
            schedule, (c, s) = (d1, (r2, r1)) if isinstance(d1, Scheduled) else (d2, (r1, r2))
            assert isinstance(schedule, Scheduled)
            due = max(due, schedule.deliver_at_ms)
            reordered += isinstance(d1, Cancel)
            accepted = buffer.accepted_ms(schedule.seq)
            if not buffer.cancels(c.offset, c.timestamp_ms, s.offset, s.timestamp_ms, accepted):
                expected_new.add(msg_id)
        print(
            f"\n{reordered} of {len(ids)} cancels reached the buffer before their message; "
            f"{len(expected_new)} of those messages came more than "
            f"{buffer.CANCEL_SENT_WITH_MS} ms after their cancel (a later request): new ones"
        )
        assert reordered > 0, "no cancel came first: the example did not exercise the fix"

        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms > due,
            timeout=60,
            what="the cancelled messages' due time to be checkpointed",
        )
        records = consume_until(bs, [topic], lambda rs_: control in delivered_ids(rs_))

        # Master and follower decide alike about this test's messages. (The shared buffer topic
        # also holds other tests' records, which a replica may find already covered by the
        # checkpoint, so the replicas' log counts may differ.) Each replica's own answer, per id.
        def decisions() -> dict[str, frozenset[str]]:
            return {
                name: frozenset(i for i in ids if _state(rs.message(name, i)) == "cancelled")
                for name in rs.replicas
            }

        with contextlib.suppress(InfrastructureError):
            wait_until(
                lambda: len(set(decisions().values())) == 1,
                timeout=30,
                what="master and follower to report the same messages cancelled",
            )
        decided = decisions()
    got = delivered_ids(records)
    assert got[control] == 1
    leaked = [i for i in ids if got[i] and i not in expected_new]
    assert all(got[i] == 1 for i in expected_new)  # the rule's new messages: delivered

    def timing(msg_id: str) -> str:
        """Buffer offsets, append times and the message's acceptance stamp, for the report."""
        out = []
        for record, decoded in about[msg_id]:
            kind = "cancel" if isinstance(decoded, Cancel) else "message"
            stamp = buffer.accepted_ms(decoded.seq) if isinstance(decoded, Scheduled) else None
            out.append(f"{kind}@{record.offset} t={record.timestamp_ms} accepted={stamp}")
        return f"{msg_id}: " + ", ".join(out)

    assert not leaked, f"{len(leaked)} of {len(ids)} cancelled messages delivered: " + "; ".join(
        timing(i) for i in leaked[:5]
    )
    assert_not_early(records)
    # Master and follower cancelled exactly the messages the rule cancels.
    cancelled = {i for i in ids if i not in expected_new}
    for name, theirs in decided.items():
        assert theirs == cancelled, (name, sorted(theirs ^ cancelled)[:5])
