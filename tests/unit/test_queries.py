"""A replica's answers about messages (delay_service/queries/queries.py) over a real store in a tmp
dir: the pending timeline's buckets, topics, horizon, chunking and truncation; a message's status
document; the replica's HTTP port serving them (health.py); and the client that asks replicas
in order (zk/replica_api.py) behind the proxy's endpoints (proxy/http/queries.py), without
ZooKeeper: the replica list is given."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack import free_port
from kdelay.buffer import Scheduled
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.errors import QueryError
from kdelay.delay_service.queries.queries import MAX_SCANS, Answers
from kdelay.delay_service.queries.timeline import MAX_BUCKETS, parse_window, timeline
from kdelay.delay_service.store.entry import entry_key
from kdelay.delay_service.store.store import Store
from kdelay.zk.replica_api import NoReplicaError, Replica, ordered
from tests.support.replica_answers import (
    GivenReplicas,
    proxy_app,
    proxy_get,
    replica_answers,
    replica_app,
    serving,
)

MIN = 60_000
#: A minute boundary (epoch ms), so bucket starts are easy to read.
T0 = 1_800_000_000_000 - 1_800_000_000_000 % MIN
NOW = T0 + 30_000  # half-way through the bucket starting at T0


def sched(
    msg_id: str, at: int, topic: str = "orders", partition: int = 0, **extra: Any
) -> Scheduled:
    return Scheduled(msg_id, topic, partition, None, b"v", at, (), f"uid-{msg_id}", **extra)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store")
    yield s
    s.close()


def fill(store: Store, messages: list[Scheduled], partition: int = 0) -> None:
    """Apply ``messages`` as buffer records 0, 1, ... of ``partition``."""
    start = store.offsets().get(partition, 0)
    records = [(partition, start + i, m) for i, m in enumerate(messages)]
    store.apply(records, {partition: start + len(messages)})


def answers(store: Store, max_scan: int = 1_000_000) -> Answers:
    return replica_answers(store, NOW, max_scan)


# -- the timeline ----------------------------------------------------------------------------


def test_timeline_counts_per_aligned_bucket_and_per_topic(store: Store) -> None:
    due = (
        # 10 in the bucket at T0 + 1 min (orders 7, audit 3), 7 in the one at T0 + 3 min
        [sched(f"a{i}", T0 + MIN + i * 1000, "orders") for i in range(7)]
        + [sched(f"b{i}", T0 + 2 * MIN - 1 - i, "audit") for i in range(3)]
        + [sched(f"c{i}", T0 + 3 * MIN + i, "orders" if i % 2 else "audit") for i in range(7)]
        # overdue: due before now, in the current bucket and in an earlier one
        + [sched("late-1", NOW - 1), sched("late-2", T0 - 5 * MIN)]
        # due exactly at now counts as overdue; beyond the horizon is not counted
        + [sched("now", NOW), sched("far", NOW + 10 * MIN)]
    )
    fill(store, due)
    doc = timeline(store, NOW, MIN, 10 * MIN, max_scan=1_000)
    assert doc["buckets"] == [
        {"start": T0 - 5 * MIN, "count": 1, "topics": {"orders": 1}},
        {"start": T0, "count": 2, "topics": {"orders": 2}},
        {"start": T0 + MIN, "count": 10, "topics": {"audit": 3, "orders": 7}},
        {"start": T0 + 3 * MIN, "count": 7, "topics": {"audit": 4, "orders": 3}},
    ]
    assert doc["topics"] == {"audit": 7, "orders": 13}
    assert (doc["counted"], doc["overdue"], doc["pending"]) == (20, 3, 21)
    assert doc["truncated"] is False
    assert doc["until_ms"] == doc["scanned_until"] == NOW + 10 * MIN
    assert (doc["now_ms"], doc["bucket_ms"], doc["horizon_ms"]) == (NOW, MIN, 10 * MIN)


def test_timeline_reads_in_chunks_and_counts_each_entry_once(store: Store) -> None:
    fill(store, [sched(f"m{i}", NOW + i * 1000, f"t{i % 3}") for i in range(50)])
    whole = timeline(store, NOW, 10_000, 60 * MIN, max_scan=1_000)
    for chunk in (1, 3, 7, 49, 50, 51):
        assert timeline(store, NOW, 10_000, 60 * MIN, max_scan=1_000, chunk=chunk) == whole
    assert whole["counted"] == 50
    assert [b["count"] for b in whole["buckets"]] == [10, 10, 10, 10, 10]
    assert whole["topics"] == {"t0": 17, "t1": 17, "t2": 16}


def test_timeline_stops_at_the_scan_limit_and_says_so(store: Store) -> None:
    fill(store, [sched(f"m{i}", NOW + i * MIN) for i in range(10)])
    doc = timeline(store, NOW, MIN, 60 * MIN, max_scan=4, chunk=3)
    assert doc["truncated"] is True
    assert doc["counted"] == 4
    assert [b["start"] for b in doc["buckets"]] == [T0 + i * MIN for i in range(4)]
    assert doc["scanned_until"] == NOW + 3 * MIN  # the last due time counted
    assert doc["pending"] == 10
    # Exactly at the limit with nothing left: not truncated.
    exact = timeline(store, NOW, MIN, 60 * MIN, max_scan=10, chunk=3)
    assert (exact["truncated"], exact["counted"]) == (False, 10)


def test_timeline_of_an_empty_store(store: Store) -> None:
    doc = timeline(store, NOW, MIN, 24 * 60 * MIN, max_scan=10)
    assert (doc["buckets"], doc["topics"], doc["counted"], doc["truncated"]) == ([], {}, 0, False)


def test_chunks_resume_after_the_last_key_even_when_it_is_gone(store: Store) -> None:
    fill(store, [sched(f"m{i}", NOW + i) for i in range(6)])
    first = store.chunk_after(None, NOW + 100, 2)
    assert len(first) == 2
    # The last key read was released meanwhile: the next chunk starts after where it was.
    entry = store.get("m1")
    assert entry is not None
    assert entry.key == first[-1][0]
    assert store.remove([entry]) == 1
    rest = store.chunk_after(first[-1][0], NOW + 100, 10)
    assert [k for k, _ in rest] == [entry_key(NOW + i, 0, i) for i in range(2, 6)]
    assert store.chunk_after(None, NOW + 3, 10)[-1][0] == entry_key(NOW + 2, 0, 2)  # due < until


@pytest.mark.parametrize(
    ("bucket", "horizon", "field", "says"),
    [
        ("1x", "1h", "bucket", "not a duration"),
        ("1m", "soon", "horizon", "not a duration"),
        ("0s", "1h", "bucket", "more than 0"),
        ("1ms", "1h", "horizon", f"more than {MAX_BUCKETS:,}"),
        ("1d", "3651d", "horizon", "at most 3650d"),
        ("99999999999999999999d", "1h", "bucket", "at most 3650d"),
    ],
)
def test_window_parameters_are_checked(bucket: str, horizon: str, field: str, says: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse_window(bucket, horizon)
    assert (caught.value.status, caught.value.field) == (400, field)
    assert says in str(caught.value)
    assert str(caught.value).startswith(f"{field}: ")


def test_window_parameters_in_any_unit() -> None:
    assert parse_window("1m", "24h") == (MIN, 24 * 60 * MIN)
    assert parse_window("500ms", "10s") == (500, 10_000)
    assert parse_window("1d", "7d") == (86_400_000, 7 * 86_400_000)


def test_answers_carry_their_freshness(store: Store) -> None:
    fill(store, [sched("m", NOW + MIN)], partition=1)
    status, doc = answers(store).message(b"m")
    assert status == 200
    assert doc["state"] == "pending"
    assert {k: doc[k] for k in ("answered_by", "role", "as_of_ms", "ingest_lag")} == {
        "answered_by": "replica-1",
        "role": "master",
        "as_of_ms": NOW,
        "ingest_lag": 0,
    }
    assert doc["ingested_offsets"] == {"1": 1}
    status, timeline_doc = answers(store).pending({"bucket": "1m", "horizon": "1h"})
    assert status == 200
    assert timeline_doc["answered_by"] == "replica-1"
    assert timeline_doc["buckets"] == [{"start": T0 + MIN, "count": 1, "topics": {"orders": 1}}]


def test_unknown_and_bad_ids(store: Store) -> None:
    status, doc = answers(store).message(b"missing")
    assert status == 404
    assert doc["field"] == "id"
    assert doc["error"].startswith("id: no message 'missing'")
    assert "replica-1 (master, ingest lag 0 records)" in doc["error"]
    assert doc["answered_by"] == "replica-1"
    assert answers(store).message(b"")[0] == 400
    assert answers(store).message(b"x" * 256)[1]["field"] == "id"
    assert "UTF-8" in answers(store).message(b"\xff")[1]["error"]


def test_before_attach_the_role_is_starting(store: Store) -> None:
    fresh = Answers(store, "r", max_scan=10).freshness()
    assert (fresh.role, fresh.ingest_lag) == ("starting", None)
    assert fresh.as_of_ms > 0


def test_too_many_timelines_at_once_are_refused(store: Store) -> None:
    scans = threading.BoundedSemaphore(MAX_SCANS)
    a = Answers(store, "replica-1", max_scan=1_000_000, scans=scans)
    a.attach(role=lambda: "master", lag=lambda: 0, clock=lambda: NOW)
    held = [scans.acquire(blocking=False) for _ in range(MAX_SCANS)]
    assert held == [True] * MAX_SCANS
    status, doc = a.pending({})
    assert status == 503
    assert "already computing" in doc["error"]
    scans.release()
    assert a.pending({})[0] == 200


# -- the replica's HTTP port -----------------------------------------------------------------


def call(app: Any, path: str, query: str = "", method: str = "GET") -> tuple[str, Any]:
    """One WSGI request, the way wsgiref passes it (PATH_INFO percent-decoded as latin-1)."""
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.update(status=status, headers=dict(headers))

    body = b"".join(
        app({"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": method}, start_response)
    )
    return seen["status"], json.loads(body) if body.startswith(b"{") else body


def port_app(store: Store) -> Any:
    return replica_app(store, NOW)


def test_the_replica_port_serves_both_queries(store: Store) -> None:
    fill(store, [sched("a/b é", NOW + MIN, "t")])
    app = port_app(store)
    path = "/v1/messages/" + "a/b é".encode().decode("latin-1")
    status, doc = call(app, path)
    assert status == "200 OK"
    assert doc["id"] == "a/b é"
    status, doc = call(app, "/v1/pending", "bucket=1m&horizon=2m")
    assert status == "200 OK"
    assert doc["topics"] == {"t": 1}
    status, doc = call(app, "/v1/pending", "bucket=nope")
    assert (status, doc["field"]) == ("400 Bad Request", "bucket")
    assert call(app, "/v1/messages/zzz")[0] == "404 Not Found"
    assert call(app, "/v1/pending", method="POST")[0] == "405 Method Not Allowed"
    assert call(app, "/healthz")[1] == {"status": "ok", "reason": ""}
    assert call(app, "/metrics")[0] == "200 OK"


def test_a_closed_store_answers_503(tmp_path: Path) -> None:
    s = Store(tmp_path / "closed")
    app = port_app(s)
    s.close()
    status, doc = call(app, "/v1/messages/m")
    assert status == "503 Service Unavailable"
    assert "closed" in doc["error"]


# -- asking replicas in order (zk/replica_api.py) ----------------------------------------


def test_replicas_are_asked_master_first_then_followers_by_lag() -> None:
    docs: dict[str, dict[str, Any]] = {
        "r1": {"role": "follower", "lag": 5, "metrics": "http://h1:1/metrics"},
        "r2": {"role": "catching-up", "lag": 0, "metrics": "http://h2:2/metrics"},
        "r3": {"role": "master", "lag": 9, "metrics": "http://[::1]:3/metrics"},
        "r4": {"role": "follower", "lag": 0, "metrics": "http://h4:4/metrics"},
        "r5": {"role": "follower", "lag": 0},  # no URL: not asked
        "r6": {"role": "follower", "metrics": "http://h6/metrics"},  # no port
    }
    assert ordered(docs) == [
        Replica("r3", "master", 9, "::1", 3),
        Replica("r4", "follower", 0, "h4", 4),
        Replica("r1", "follower", 5, "h1", 1),
        Replica("r2", "catching-up", 0, "h2", 2),
    ]


@pytest.fixture
def replica_port(store: Store) -> Iterator[int]:
    """The replica's HTTP port (health.py's app) on loopback, over ``store``."""
    with serving(store, NOW) as port:
        yield port


def closed_port() -> int:
    return free_port()


@contextlib.contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


def test_the_first_replica_that_answers_is_the_answer(store: Store, replica_port: int) -> None:
    fill(store, [sched("m", NOW + MIN)])
    with silent_port() as silent:
        api = GivenReplicas(
            [
                Replica("dead", "master", 0, "127.0.0.1", closed_port()),
                Replica("mute", "follower", 0, "127.0.0.1", silent),
                Replica("ok", "follower", 1, "127.0.0.1", replica_port),
            ],
            timeout_s=2.0,
            connect_timeout_s=1.0,
        )
        answer = api.message("m")
        assert (answer.status, answer.replica, answer.body["state"]) == (200, "ok", "pending")
        assert api.message("unknown").status == 404
        assert api.pending("1m", "1h").body["counted"] == 1


def test_no_replica_answering_names_each_one(store: Store) -> None:
    with silent_port() as silent:
        api = GivenReplicas(
            [
                Replica("dead", "master", 0, "127.0.0.1", closed_port()),
                Replica("mute", "follower", 0, "127.0.0.1", silent),
            ],
            timeout_s=0.5,
        )
        with pytest.raises(NoReplicaError) as caught:
            api.message("m")
        text = str(caught.value)
        assert "dead (master): ConnectionRefusedError" in text
        assert "mute (follower): " in text
    with pytest.raises(NoReplicaError, match="no delay-service replica is registered"):
        GivenReplicas([]).message("m")


def test_with_shards_the_one_that_knows_the_id_answers_and_timelines_add_up(
    store: Store, replica_port: int, tmp_path: Path
) -> None:
    """A delay set of two shards (zk/layout.py): each replica knows its own partitions only."""
    fill(store, [sched("a", NOW + MIN, "t")])
    other = Store(tmp_path / "other")
    try:
        fill(other, [sched("b", NOW + MIN, "t"), sched("c", NOW + 2 * MIN, "u")], partition=1)
        with serving(other, NOW) as other_port:
            api = GivenReplicas(
                [Replica("s0", "master", 0, "127.0.0.1", replica_port)],
                [Replica("s1", "master", 0, "127.0.0.1", other_port)],
            )
            assert api.message("a").body["state"] == "pending"
            assert api.message("b").body["buffer"]["partition"] == 1
            missing = api.message("nobody")
            assert missing.status == 404
            assert "in any of the 2 shards" in missing.body["error"]
            assert missing.body["field"] == "id"
            doc = api.pending("1m", "1h").body
            assert (doc["counted"], doc["pending"], doc["overdue"]) == (3, 3, 0)
            assert doc["topics"] == {"t": 2, "u": 1}
            starts = {b["start"]: b["count"] for b in doc["buckets"]}
            assert starts == {T0 + MIN: 2, T0 + 2 * MIN: 1}
            assert [(s["shard"], s["answered_by"]) for s in doc["shards"]] == [
                (0, "replica-1"),
                (1, "replica-1"),
            ]
            assert set(doc["ingested_offsets"]) == {"0", "1"}
            # A shard nobody answers for: its ids cannot be told from unknown ones.
            half = GivenReplicas(
                [Replica("s0", "master", 0, "127.0.0.1", replica_port)],
                [Replica("gone", "master", 0, "127.0.0.1", closed_port())],
                timeout_s=1.0,
            )
            with pytest.raises(NoReplicaError, match=r"shard 1: .*gone"):
                half.message("nobody")
    finally:
        other.close()


# -- the proxy's endpoints -------------------------------------------------------------------


def test_the_proxy_without_zk_connect_answers_503_naming_it() -> None:
    app = proxy_app(None)
    for url in ("/v1/messages/m", "/v1/pending?bucket=1m&horizon=1h"):
        resp = proxy_get(app, url)
        assert resp.status_code == 503
        assert resp.json()["error"].startswith("zk_connect: ")
        assert "retry-after" not in resp.headers


def test_the_proxy_passes_a_replica_answer_on(store: Store, replica_port: int) -> None:
    fill(store, [sched("m 1", NOW + MIN, "t")])
    app = proxy_app(GivenReplicas([Replica("ok", "master", 0, "127.0.0.1", replica_port)]))
    resp = proxy_get(app, "/v1/messages/m%201")
    assert resp.status_code == 200, resp.text
    assert (resp.json()["state"], resp.json()["answered_by"]) == ("pending", "replica-1")
    missing = proxy_get(app, "/v1/messages/gone")
    assert missing.status_code == 404
    assert set(missing.json()) == {"error", "field"}
    assert missing.json()["field"] == "id"
    assert proxy_get(app, "/v1/pending?horizon=1h").json()["topics"] == {"t": 1}
    bad = proxy_get(app, "/v1/pending?bucket=1ms&horizon=1d")  # too many buckets: the replica
    assert (bad.status_code, bad.json()["field"]) == (400, "horizon")
    assert proxy_get(app, "/v1/pending?bucket=x").json()["field"] == "bucket"
    assert proxy_get(app, "/v1/messages/" + "y" * 300).status_code == 400


def test_the_proxy_answers_503_with_retry_after_when_no_replica_answers() -> None:
    app = proxy_app(GivenReplicas([Replica("dead", "master", 0, "127.0.0.1", closed_port())]))
    resp = proxy_get(app, "/v1/messages/m")
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "1"
    assert "dead (master)" in resp.json()["error"]


# -- where a replica says it can be reached ------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "env", "published"),
    [
        ({"metrics_host": "127.0.0.1"}, {}, "127.0.0.1"),
        ({"metrics_host": "0.0.0.0"}, {"POD_IP": "10.1.2.3"}, "10.1.2.3"),
        ({"metrics_host": "::"}, {"POD_IP": "fd00::7"}, "[fd00::7]"),
        ({"metrics_host": "0.0.0.0", "advertised_host": "r-0.svc"}, {"POD_IP": "1"}, "r-0.svc"),
        ({"metrics_host": "0.0.0.0"}, {}, socket.gethostname()),
    ],
)
def test_the_published_host_is_never_a_wildcard(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], env: dict[str, str], published: str
) -> None:
    monkeypatch.delenv("POD_IP", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert ReplicaConfig(name="r", **settings).published_host == published  # type: ignore[arg-type]
