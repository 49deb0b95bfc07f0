"""The README's cancel example, exactly, through a real proxy to real replicas: a message with a
key and an id, then its ``kdelay-cancel`` to the same topic with the same key, twenty times, one
``flush``, three times; and the same with the cancel sent without a key, the way the README
showed it before.

With the key, message and cancel go from one idempotent producer to one partition, so the
producer's sequence numbers order them (the proxy stamps both, route field ``q``) and every
message is cancelled, whatever request librdkafka carried it in; a message of the id sent again
*after* the cancel in the same flush (a reschedule) is never cancelled by it, although the proxy
writes a request's cancels after its other records. Without the key the cancel goes to another
partition (mostly): then a cancel that reaches the buffer topic before its message cancels it
when a proxy accepted it within ``CANCEL_SENT_WITH_MS`` of the cancel's append (broker clock),
and a message that librdkafka carried in a request sent after the cancel's answer is a new one.
The replicas, master and follower alike, deliver exactly what the rule leaves, and a message
without a cancel. Each variant prints its figures (how many messages escaped their cancel, and
how many the rule without sequence numbers would have let escape or cancelled wrongly).
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
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
AGAIN = 5  # with the key, every fifth id is scheduled again right after its cancel


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


def readme_example(  # noqa: PLR0917 - the example's knobs
    port: int,
    topic: str,
    ids: list[str],
    failures: list[KafkaError],
    keyed: bool,
    again: frozenset[str] = frozenset(),
) -> None:
    """The README's example (a 3 s delay instead of 30 minutes), once per id, one flush; the
    cancel with the message's key when ``keyed``; the ids in ``again`` scheduled once more
    right after their cancel (value ``again``)."""

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True})
    for i, msg_id in enumerate(ids):
        key = f"order-{i}".encode()
        timing: list[tuple[str, str | bytes | None]] = [
            ("kdelay-delay-ms", b"3000"),
            ("kdelay-id", msg_id.encode()),
        ]
        p.produce(topic, b"timeout", key=key, headers=timing, on_delivery=on_delivery)
        p.produce(
            topic,
            b"",
            key=key if keyed else None,
            headers=[("kdelay-cancel", msg_id.encode())],  # changed our mind
            on_delivery=on_delivery,
        )
        if msg_id in again:
            p.produce(topic, b"again", key=key, headers=timing, on_delivery=on_delivery)
    assert p.flush(60) == 0


@pytest.mark.parametrize("keyed", [True, False], ids=["cancel-with-key", "cancel-without-key"])
def test_the_readme_cancel_example_cancels_what_the_rule_says(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path: Path, keyed: bool
) -> None:
    bs = kafka.bootstrap_servers
    topic = unique_topic("orders")
    create_target(bs, topic, partitions=6)  # keyless cancels part ways with keyed messages
    run = uuid.uuid4().hex[:8]
    # Three runs of the example: the keyless cancels of one producer share a partition, which
    # a request may list after every message's (then no cancel comes first).
    rounds = [[f"order-{i}-timeout-{run}-{n}" for i in range(PAIRS)] for n in range(ROUNDS)]
    ids = [msg_id for one in rounds for msg_id in one]
    again = frozenset(ids[::AGAIN]) if keyed else frozenset()
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
                readme_example(port, topic, one, failures, keyed, again)
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
        wanted = 2 * len(ids) + len(again) + 1
        buffered = consume_until(
            bs,
            [BUFFER_TOPIC],
            lambda rs_: sum(map(len, _about(rs_, mine).values())) >= wanted,
            timeout=60,
        )
        about = _about(buffered, mine)
        reordered = 0  # cancels that reached the buffer before their message
        due = 0
        left: dict[str, list[bytes]] = {}  # per id, the values the rule leaves to deliver
        old_escapes = old_wrong = 0  # what the rule without sequence numbers would decide
        for msg_id in ids:
            (c_raw, c), *_ = [(r, d) for r, d in about[msg_id] if isinstance(d, Cancel)]
            left[msg_id] = []
            for s_raw, s in about[msg_id]:
                if not isinstance(s, Scheduled):
                    continue
                assert s_raw.partition == c_raw.partition  # every record of an id: one partition
                due = max(due, s.deliver_at_ms)
                first = s.value == b"timeout"
                reordered += first and s_raw.offset > c_raw.offset
                order = buffer.produced_before(c.producer_seq, s.producer_seq)
                if keyed:  # one producer, one partition: the sequence orders them
                    assert order is first, (msg_id, c.producer_seq, s.producer_seq)
                accepted = buffer.accepted_ms(s.seq)
                args = (c_raw.offset, c_raw.timestamp_ms, s_raw.offset, s_raw.timestamp_ms)
                old = buffer.cancels(*args, accepted)
                old_escapes += first and not old
                old_wrong += not first and old
                if not buffer.cancels(*args, accepted, order=order):
                    left[msg_id].append(s.value or b"")
        escaped = sum(b"timeout" in v for v in left.values())
        print(
            f"\n{'keyed' if keyed else 'keyless'} cancels: {reordered} of {len(ids)} reached "
            f"the buffer before their message; {escaped} of {len(ids)} messages escape their "
            f"cancel (without sequence numbers: {old_escapes} escapes, {old_wrong} of "
            f"{len(again)} reschedules sent after the cancel cancelled)"
        )
        if keyed:
            assert escaped == 0
            assert all(left[i] == ([b"again"] if i in again else []) for i in ids)
        else:
            assert reordered > 0, "no cancel came first: the example did not exercise the rule"

        wait_until(
            lambda: (cp := rs.checkpoint()) is not None and cp.time_ms > due,
            timeout=60,
            what="the cancelled messages' due time to be checkpointed",
        )
        records = consume_until(bs, [topic], lambda rs_: control in delivered_ids(rs_))
        single = [i for i in ids if i not in again]  # one message each: its state says it all

        # Master and follower decide alike about this test's messages. (The shared buffer topic
        # also holds other tests' records, which a replica may find already covered by the
        # checkpoint, so the replicas' log counts may differ.) Each replica's own answer, per id.
        def decisions() -> dict[str, frozenset[str]]:
            return {
                name: frozenset(i for i in single if _state(rs.message(name, i)) == "cancelled")
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
    delivered: dict[str, list[bytes]] = {i: [] for i in ids}
    for r in records:
        msg_id = (r.header("kdelay-id") or b"").decode()
        if msg_id in delivered:
            delivered[msg_id].append(r.value or b"")

    def timing(msg_id: str) -> str:
        """Buffer offsets, append times and the message's acceptance stamp, for the report."""
        out = []
        for record, decoded in about[msg_id]:
            kind = "cancel" if isinstance(decoded, Cancel) else "message"
            stamp = buffer.accepted_ms(decoded.seq) if isinstance(decoded, Scheduled) else None
            q = decoded.producer_seq if isinstance(decoded, Scheduled | Cancel) else None
            out.append(f"{kind}@{record.offset} t={record.timestamp_ms} accepted={stamp} q={q}")
        return f"{msg_id}: " + ", ".join(out)

    wrong = [i for i in ids if sorted(delivered[i]) != sorted(left[i])]
    assert not wrong, f"{len(wrong)} of {len(ids)} delivered otherwise than the rule: " + "; ".join(
        f"{timing(i)} delivered {delivered[i]}" for i in wrong[:5]
    )
    assert_not_early(records)
    # Master and follower cancelled exactly the messages the rule cancels.
    cancelled = {i for i in single if not left[i]}
    for name, theirs in decided.items():
        assert theirs == cancelled, (name, sorted(theirs ^ cancelled)[:5])
