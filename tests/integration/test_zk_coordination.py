"""zk/ against a real ZooKeeper: election order, fenced checkpoint writes, registry view."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from dev.stack import wait_until
from kdelay.zk import (
    CheckpointStore,
    Election,
    FencedError,
    Paths,
    Registry,
    cluster_status,
    read_checkpoint,
)
from tests.support.infra import ZooKeeperInfra
from tests.support.zk_helpers import expire_session


@pytest.fixture
def clients(zookeeper: ZooKeeperInfra) -> Iterator[list[KazooClient]]:
    out = [KazooClient(hosts=zookeeper.connect, timeout=3.0) for _ in range(3)]
    for c in out:
        c.start(timeout=15)
    yield out
    for c in out:
        c.stop()
        c.close()


def paths() -> Paths:
    return Paths(f"/kdelay-test/{uuid.uuid4().hex[:10]}")


def test_deposed_master_checkpoint_write_fails(clients: list[KazooClient]) -> None:
    p = paths()
    a = CheckpointStore(clients[0], p, "a")
    b = CheckpointStore(clients[1], p, "b")
    ea = a.claim_epoch()
    assert a.load() is None
    assert read_checkpoint(clients[2], p) is None
    a.write(b'{"claim":"a1"}')
    eb = b.claim_epoch()
    assert eb > ea
    assert b.load() == b'{"claim":"a1"}'  # opaque bytes, as written
    with pytest.raises(FencedError, match="rejected"):
        a.write(b'{"claim":"a2"}')
    b.write(b'{"claim":"b1"}')
    assert b.load() == b'{"claim":"b1"}'
    assert read_checkpoint(clients[2], p) == b'{"claim":"b1"}'
    # The status view passes the document on as JSON.
    assert cluster_status(clients[2], p)["checkpoint"] == {"claim": "b1"}


def test_lowest_candidate_leads_and_leadership_passes_on(clients: list[KazooClient]) -> None:
    p = paths()
    flags: dict[str, threading.Event] = {n: threading.Event() for n in "abc"}

    def on(name: str) -> Callable[[bool], None]:
        def change(leader: bool) -> None:
            if leader:
                flags[name].set()
            else:
                flags[name].clear()

        return change

    elections = [Election(c, p, n, on(n)) for c, n in zip(clients, "abc", strict=True)]
    for e in elections:
        e.join()
    wait_until(flags["a"].is_set, timeout=10, what="a to lead")
    assert not flags["b"].is_set()
    assert cluster_status(clients[2], p)["master"] == "a"
    elections[0].leave()
    wait_until(flags["b"].is_set, timeout=10, what="b to lead")
    expire_session(clients[1])  # b's node vanishes with its session
    wait_until(flags["c"].is_set, timeout=15, what="c to lead after b's session expired")


def test_registry_publishes_ephemeral_status(clients: list[KazooClient]) -> None:
    p = paths()
    reg = Registry(clients[0], p, "r1")
    reg.publish({"role": "follower", "lag": 3, "pending": 7})
    reg.publish({"role": "master", "lag": 0, "pending": 8})
    status = cluster_status(clients[1], p)
    assert status["replicas"] == [{"name": "r1", "role": "master", "lag": 0, "pending": 8}]
    assert status["master"] is None
    assert status["checkpoint"] == {}
    expire_session(clients[0])
    wait_until(
        lambda: cluster_status(clients[1], p)["replicas"] == [], timeout=15, what="node to vanish"
    )
