"""Producer ids on a SASL proxy, attacked by another principal, against a real secured Kafka.

The proxy hands out producer ids itself (InitProducerId) and dedupes each producer's batches by
(producer id, epoch, sequence). Before, any logged-in principal could present any id:

- (a) bob sends a batch with alice's producer id, epoch and next sequence number: it is written,
  and alice's own batch with that sequence is then answered as a duplicate, acknowledged and
  never written (silent loss of her record).
- (b) bob fences alice's idempotent librdkafka producer: a batch with her id and a higher epoch
  (or an InitProducerId with her id and epoch, which bumped her epoch) makes her next batches
  fail with INVALID_PRODUCER_EPOCH.

After, an id the proxy handed out belongs to the principal that got it from InitProducerId:
another principal's batch with it is answered UNKNOWN_PRODUCER_ID and changes nothing, and its
InitProducerId with it gets a fresh id of its own.

- (c) The bound: an id a proxy did not hand out (after a restart, on another worker) is adopted
  per principal. bob presents alice's id on the restarted proxy before she does, at the sequence
  her next batch carries: he gets a producer state of his own, and hers is untouched; every
  record of hers is delivered, none lost, under the same id.

Waits are failure detection only (no speed is asserted).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, Message, Producer

from dev.stack import wait_until
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from kdelay.proxy.config import ProxyConfig
from tests.support.kafka_helpers import consume_until, create_topic, unique_topic
from tests.support.raw_client import (
    RawClient,
    init_producer_id_request,
    plain_token,
    produce_with_id,
    sasl_authenticate_request,
    sasl_handshake_request,
)
from tests.support.secure_kafka import SecureKafka, secured_kafka

UNKNOWN_PRODUCER_ID = kerr.UnknownProducerIdError.errno


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("attack-pids"), "SASL_SSL") as sk:
        yield sk


def _config(secure: SecureKafka) -> ProxyConfig:
    return secure.proxy_config("SASL_PLAINTEXT")


@pytest.fixture(scope="module")
def proxy(secure: SecureKafka) -> Iterator[Proxy]:
    with running_proxy(_config(secure)) as px:
        yield px


def _addr(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _topic(secure: SecureKafka) -> str:
    topic = unique_topic("pids")
    create_topic(secure.plain, topic, partitions=1)
    secure.grant("alice", topic)
    secure.grant("bob", topic)
    return topic


def _login(address: str, secure: SecureKafka, user: str) -> RawClient:
    client = RawClient(address)
    try:
        assert client.request(sasl_handshake_request("PLAIN")).error_code == 0
        token = plain_token(user, secure.password(user))
        assert client.request(sasl_authenticate_request(token)).error_code == 0
    except BaseException:
        client.close()
        raise
    return client


def _values(secure: SecureKafka, topic: str, expected: set[bytes]) -> set[bytes]:
    """What ``topic`` holds once it holds ``expected`` (or a timeout, with what it holds)."""
    seen: set[bytes] = set()

    def done(records: list[Any]) -> bool:
        seen.update(r.value or b"" for r in records)
        return expected <= seen

    consume_until(secure.plain, [topic], done, timeout=30)
    return seen


def test_another_principals_batch_with_your_producer_id_is_refused(
    secure: SecureKafka, proxy: Proxy
) -> None:
    """(a): bob's batch at alice's next sequence no longer swallows hers."""
    topic = _topic(secure)
    with _login(_addr(proxy), secure, "alice") as alice, _login(_addr(proxy), secure, "bob") as bob:
        init = alice.request(init_producer_id_request())
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        assert produce_with_id(alice, topic, b"alice-0", pid, epoch=epoch, seq=0).error_code == 0

        stolen = produce_with_id(bob, topic, b"bob-1", pid, epoch=epoch, seq=1)
        assert stolen.error_code == UNKNOWN_PRODUCER_ID, "bob wrote with alice's producer id"
        fenced = produce_with_id(bob, topic, b"bob-fence", pid, epoch=epoch + 1, seq=0)
        assert fenced.error_code == UNKNOWN_PRODUCER_ID, "bob fenced alice's epoch"

        assert produce_with_id(alice, topic, b"alice-1", pid, epoch=epoch, seq=1).error_code == 0
        assert produce_with_id(alice, topic, b"alice-2", pid, epoch=epoch, seq=2).error_code == 0
    seen = _values(secure, topic, {b"alice-0", b"alice-1", b"alice-2"})
    assert not seen & {b"bob-1", b"bob-fence"}


class _Alice:
    """alice's idempotent librdkafka producer, its delivery reports and its producer id (from
    librdkafka's statistics, as any client can read its own)."""

    def __init__(self, secure: SecureKafka, address: str) -> None:
        conf = secure.client("alice", "SCRAM-SHA-512", **{"security.protocol": "SASL_PLAINTEXT"})
        conf.pop("ssl.ca.location", None)
        self.failed: list[KafkaError] = []
        #: Fatal errors (a reconnect's transient ones are not).
        self.fatal: list[KafkaError] = []
        self.delivered = 0
        self.pid: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self.producer = Producer(
            {
                "bootstrap.servers": address,
                **conf,
                "enable.idempotence": True,
                "linger.ms": 0,
                "message.timeout.ms": 60_000,
                "statistics.interval.ms": 100,
                "stats_cb": self._stats,
                "error_cb": self._error,
            }
        )

    def _stats(self, raw: str) -> None:
        eos = json.loads(raw).get("eos", {})
        if eos.get("idemp_state") == "Assigned":
            with self._lock:
                self.pid = (int(eos["producer_id"]), int(eos["producer_epoch"]))

    def _error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal.append(err)

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed.append(err)

    def send(self, topic: str, values: list[bytes]) -> None:
        """Produce ``values`` one batch each and wait for their reports."""
        for value in values:
            self.producer.produce(topic, value, on_delivery=self._report)
            assert self.producer.flush(60) == 0, "alice's records were not acknowledged in 60 s"

    def producer_id(self) -> tuple[int, int]:
        """Her (producer id, epoch) as librdkafka's next statistics name it."""
        self.pid = None

        def known() -> bool:
            self.producer.poll(0.05)
            return self.pid is not None

        wait_until(known, timeout=30, what="alice's producer id in librdkafka's statistics")
        assert self.pid is not None
        return self.pid


def test_another_principal_cannot_fence_your_idempotent_producer(
    secure: SecureKafka, proxy: Proxy
) -> None:
    """(b): neither a higher epoch on alice's id nor an InitProducerId with it touches her."""
    topic = _topic(secure)
    alice = _Alice(secure, _addr(proxy))
    alice.send(topic, [b"alice-0", b"alice-1"])
    pid, epoch = alice.producer_id()
    with _login(_addr(proxy), secure, "bob") as bob:
        bump = bob.request(init_producer_id_request(producer_id=pid, epoch=epoch))
        assert bump.error_code == 0
        assert bump.producer_id != pid, "bob's InitProducerId bumped alice's epoch"
        fence = produce_with_id(bob, topic, b"bob-fence", pid, epoch=epoch + 5, seq=0)
        assert fence.error_code == UNKNOWN_PRODUCER_ID, "bob fenced alice's producer"
    mine = [f"alice-{i}".encode() for i in range(2, 7)]
    alice.send(topic, mine)
    assert alice.failed == []
    assert alice.fatal == []
    assert alice.delivered == 7
    assert alice.producer_id() == (pid, epoch), "alice's producer had to start over"
    assert b"bob-fence" not in _values(secure, topic, {b"alice-0", b"alice-1", *mine})


def test_an_id_claimed_first_after_a_restart_costs_its_owner_nothing(
    secure: SecureKafka,
) -> None:
    """(c): the bound of a proxy that did not hand the id out (module docstring)."""
    topic = _topic(secure)
    cfg = _config(secure)
    with running_proxy(cfg) as px:
        alice = _Alice(secure, _addr(px))
        alice.send(topic, [b"alice-0", b"alice-1"])
        pid, epoch = alice.producer_id()
    with running_proxy(cfg) as px:  # the same address: alice's producer reconnects to it
        with _login(_addr(px), secure, "bob") as bob:
            # bob presents alice's id first, at the sequence her next batch will carry.
            assert produce_with_id(bob, topic, b"bob-2", pid, epoch=epoch, seq=2).error_code == 0
        mine = [f"alice-{i}".encode() for i in range(2, 6)]
        alice.send(topic, mine)
        assert alice.failed == []
        assert alice.fatal == []
        assert alice.delivered == 6
        assert alice.producer_id() == (pid, epoch), "alice's producer had to start over"
    _values(secure, topic, {b"alice-0", b"alice-1", b"bob-2", *mine})
