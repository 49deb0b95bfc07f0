"""zk/ after ZooKeeper faults: sessions restored after a restart, no stale candidate left
leading, and a master whose process is gone shown as stale (issue "Safe by default").
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from dev.stack import wait_until
from kdelay.zk import (
    CONNECTED,
    LOST,
    SUSPENDED,
    Election,
    Paths,
    Registry,
    Session,
    cluster_status,
    current_leader,
)
from tests.support.infra import ZooKeeperInfra

#: 15 s: on a loaded machine (a CI run) a client reconnected more than 4 s, and once more than
#: 6 s, after the server started, and found its session expired. (The local ZooKeeper allows
#: up to 30 s.)
SESSION_S = 15.0
#: Longer than the session: the server restores sessions with a fresh timeout when it starts,
#: and zk.connection's reconnect cap (0.5 s) comes back well within it. (kazoo's default back-off
#: doubles, with compounding jitter, to minutes: after an outage like this its next attempt
#: may or may not come within the session, so this test does not try to show it failing.)
OUTAGE_S = 20.0


def _paths() -> Paths:
    return Paths(f"/kdelay-test/{uuid.uuid4().hex[:10]}")


@pytest.fixture
def sessions(zookeeper: ZooKeeperInfra) -> Iterator[list[Session]]:
    out = [Session(zookeeper.connect, SESSION_S) for _ in range(3)]
    for s in out:
        s.start(timeout=15)
    yield out
    for s in out:
        s.stop()


def _flag(flags: dict[str, threading.Event], name: str) -> Callable[[bool], None]:
    def change(leader: bool) -> None:
        (flags[name].set if leader else flags[name].clear)()

    return change


def test_after_a_zookeeper_restart_sessions_are_restored_and_no_stale_candidate_leads(
    zookeeper: ZooKeeperInfra, sessions: list[Session]
) -> None:
    local = zookeeper.local
    if local is None:
        pytest.skip("restarting ZooKeeper needs KDELAY_TEST_INFRA=local")
    p = _paths()
    # What a master's leave() leaves behind when its delete is lost with the connection: its
    # candidate node, lowest of all, in a session the server will restore.
    sessions[0].client.create(
        f"{p.election}/n_", b"a", ephemeral=True, sequence=True, makepath=True
    )
    flags = {n: threading.Event() for n in "abc"}
    b = Election(sessions[1].client, p, "b", _flag(flags, "b"))
    b.join()
    c = Election(sessions[2].client, p, "c", _flag(flags, "c"))
    c.join()
    c_node = f"{p.election}/{c.node}"
    session_ids = [s.session_id() for s in sessions]
    for s in sessions:
        s.changes()
    local.stop()
    try:
        wait_until(
            lambda: all(s.state == SUSPENDED for s in sessions), timeout=30, what="SUSPENDED"
        )
        # A step-down during the outage does not wait for ZooKeeper to come back.
        leaving = threading.Thread(target=c.leave)
        leaving.start()
        leaving.join(timeout=30)
        assert not leaving.is_alive(), "leave() waited for ZooKeeper"
        time.sleep(OUTAGE_S)  # sleep: the fault's duration, not a synchronisation
    finally:
        local.start()
    wait_until(
        lambda: all(s.state == CONNECTED for s in sessions),
        timeout=60,
        what="every session to reconnect",
    )
    # Restored, not replaced: the capped reconnect back-off came back within the session.
    assert [s.session_id() for s in sessions] == session_ids
    assert all(LOST not in s.changes() for s in sessions)
    # c's delete, queued while ZooKeeper was away, ran on reconnection.
    wait_until(
        lambda: sessions[0].client.exists(c_node) is None, timeout=10, what="c's node deleted"
    )
    # The restored session kept the stale node, which still leads: nobody forwards.
    assert current_leader(sessions[2].client, p) == "a"
    assert not flags["b"].is_set()
    a = Election(sessions[0].client, p, "a", _flag(flags, "a"))
    a.join()  # deletes the node its own session still owns, then queues up behind b
    wait_until(flags["b"].is_set, timeout=10, what="b to lead once a's stale node is gone")
    assert current_leader(sessions[2].client, p) == "b"
    assert not flags["a"].is_set()
    assert a.node is not None
    assert a.node != b.node


def test_a_master_that_stopped_refreshing_its_status_is_shown_stale(
    sessions: list[Session],
) -> None:
    p = _paths()
    client = sessions[0].client
    flags = {"a": threading.Event()}
    election = Election(client, p, "a", _flag(flags, "a"))
    election.join()
    wait_until(flags["a"].is_set, timeout=10, what="a to lead")
    Registry(client, p, "a").publish({"role": "master", "candidate": election.node, "pid": 1})
    viewer = sessions[1].client
    live = cluster_status(viewer, p, stale_after_s=60)
    assert (live["master"], live["master_state"]) == ("a", "live")
    assert "stale_master" not in live
    # The session lives on (a frozen or just-killed process), but the status is not refreshed.
    wait_until(
        lambda: cluster_status(viewer, p, stale_after_s=0.5)["master_state"] == "stale",
        timeout=30,
        what="the master to be shown stale",
    )
    doc = cluster_status(viewer, p, stale_after_s=0.5)
    assert doc["master"] is None
    assert doc["stale_master"]["name"] == "a"
    assert doc["stale_master"]["node"] == election.node
    assert "no status update from a" in doc["stale_master"]["reason"]
    assert [r["name"] for r in doc["replicas"]] == ["a"]


def test_a_restarted_replica_does_not_vouch_for_its_dead_predecessors_node(
    sessions: list[Session],
) -> None:
    p = _paths()
    old = Election(sessions[0].client, p, "a", lambda _leader: None)
    old.join()  # the process that was killed; its session has not expired yet
    restarted = Registry(sessions[1].client, p, "a")  # same name, new process and session
    viewer = sessions[2].client

    def refreshed_status() -> str:
        restarted.publish({"role": "catching-up", "candidate": None, "pid": 2})
        return str(cluster_status(viewer, p, stale_after_s=60)["master_state"])

    # Live while the restarted process's documents may predate the node (a second's grace).
    wait_until(lambda: refreshed_status() == "stale", timeout=30, what="a stale master")
    doc = cluster_status(viewer, p, stale_after_s=60)
    assert doc["master"] is None
    assert "earlier session" in doc["stale_master"]["reason"]
    assert doc["stale_master"]["node"] == old.node
