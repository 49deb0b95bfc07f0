"""The listing of pending messages (delay_service/queries/listing.py's ``list_pending``,
CONTRACT.md v3 "Listing") over a real store in a tmp dir: due order, paging by cursor, releases
between pages, each filter, the scan budget of a rarely matching filter, bad parameters, the
replica's HTTP route (health.py), and the merge of shards' pages (zk/list_merge.py) against one
store."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kdelay.buffer import Scheduled
from kdelay.delay_service import health
from kdelay.delay_service.errors import QueryError
from kdelay.delay_service.queries.listing import (
    LIST_MAX,
    ListFilter,
    decode_cursor,
    encode_cursor,
    list_pending,
    parse_listing,
)
from kdelay.delay_service.queries.queries import Answers
from kdelay.delay_service.queries.timeline import timeline
from kdelay.delay_service.store.store import Store
from kdelay.zk.list_merge import merge_pages
from kdelay.zk.replica_api import Replica
from tests.support.replica_answers import GivenReplicas, proxy_app, proxy_get, serving

T0 = 1_800_000_000_000
NOW = T0 + 30_000


def sched(msg_id: str, at: int, topic: str = "orders", **extra: Any) -> Scheduled:
    return Scheduled(msg_id, topic, -1, None, b"v", at, (), f"uid-{msg_id}", **extra)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store")
    yield s
    s.close()


def fill(store: Store, messages: list[Scheduled], partition: int = 0) -> None:
    """Apply ``messages`` as the next buffer records of ``partition``."""
    start = store.offsets().get(partition, 0)
    records = [(partition, start + i, m) for i, m in enumerate(messages)]
    store.apply(records, {partition: start + len(messages)})


def mixed(n: int, seed: int = 7) -> list[Scheduled]:
    """``n`` messages over two topics and two id prefixes, due times shuffled, some equal."""
    rng = random.Random(seed)
    return [
        sched(
            f"{'cust-a' if i % 3 else 'cust-b'}-{i}",
            T0 + rng.randrange(0, 50) * 1000,
            "orders" if i % 2 else "refunds",
        )
        for i in range(n)
    ]


def walk(
    store: Store, flt: ListFilter, limit: int, *, max_scan: int = 200_000, chunk: int = 7
) -> tuple[list[dict[str, Any]], int]:
    """Every page's messages, following ``next``; and how many pages it took."""
    out: list[dict[str, Any]] = []
    after: bytes | None = None
    pages = 0
    while True:
        page = list_pending(store, flt, limit=limit, after=after, max_scan=max_scan, chunk=chunk)
        pages += 1
        assert len(page["messages"]) <= limit
        out.extend(page["messages"])
        if page["next"] is None:
            return out, pages
        after = decode_cursor(page["next"])


def expected(messages: list[Scheduled], keep: Any = lambda m: True) -> list[str]:
    """The ids a listing should give: due order, then acceptance (buffer offset) order."""
    order = sorted(range(len(messages)), key=lambda i: (messages[i].deliver_at_ms, i))
    return [messages[i].id for i in order if keep(messages[i])]


def test_pages_list_each_message_once_in_due_order(store: Store) -> None:
    messages = mixed(300)
    fill(store, messages)
    listed, pages = walk(store, ListFilter(), 50)
    assert [m["id"] for m in listed] == expected(messages)
    assert pages == 6  # the sixth page is full and its next is null: no empty seventh
    assert {m["state"] for m in listed} == {"pending"}
    first = listed[0]
    assert set(first) == {"id", "state", "deliver_at", "topic", "partition", "cursor"}
    assert first["partition"] is None  # -1: chosen by key at release
    dues = [m["deliver_at"] for m in listed]
    assert dues == sorted(dues)


def test_a_release_between_pages_repeats_and_skips_none_still_pending(store: Store) -> None:
    messages = mixed(300)
    fill(store, messages)
    seen: list[str] = []
    page = list_pending(store, ListFilter(), limit=50, chunk=7)
    seen += [m["id"] for m in page["messages"]]
    released: set[str] = set()
    cut = T0
    while page["next"] is not None:
        # Between pages the master releases what fell due: listed ones and not yet listed ones.
        cut += 12_000
        due = store.due(cut, 10_000)
        released |= {e.message.id for e in due}
        store.remove(due)
        page = list_pending(
            store, ListFilter(), limit=50, after=decode_cursor(page["next"]), chunk=7
        )
        seen += [m["id"] for m in page["messages"]]
    assert len(seen) == len(set(seen)), "a message was listed twice"
    still_pending = {m.id for m in messages} - released
    assert still_pending <= set(seen), "a message that stayed pending was skipped"
    assert released - set(seen), "the test should release some before they were listed"


def test_filters_by_topic_id_prefix_owner_and_due_time(store: Store) -> None:
    messages = mixed(200)
    messages += [sched(f"own-{i}", T0 + i, owner="User:alice") for i in range(5)]
    messages += [sched(f"own-b{i}", T0 + i, owner="User:bob") for i in range(5)]
    fill(store, messages)
    cases: list[tuple[ListFilter, Any]] = [
        (ListFilter(topic="refunds"), lambda m: m.topic == "refunds"),
        (ListFilter(id_prefix="cust-b"), lambda m: m.id.startswith("cust-b")),
        (
            ListFilter(topic="orders", id_prefix="cust-a"),
            lambda m: m.topic == "orders" and m.id.startswith("cust-a"),
        ),
        (ListFilter(owner="User:alice"), lambda m: m.owner == "User:alice"),
        (ListFilter(due_before_ms=T0 + 20_000), lambda m: m.deliver_at_ms < T0 + 20_000),
        (ListFilter(topic="nowhere"), lambda m: False),
    ]
    for flt, keep in cases:
        listed, _ = walk(store, flt, 13)
        assert [m["id"] for m in listed] == expected(messages, keep), flt


def test_a_rare_match_costs_bounded_pages_that_go_on_where_they_stopped(store: Store) -> None:
    messages = [sched(f"n-{i}", T0 + i) for i in range(1000)]
    messages[10] = sched("rare-1", T0 + 10)
    messages[990] = sched("rare-2", T0 + 990)
    fill(store, messages)
    page = list_pending(store, ListFilter(id_prefix="rare"), limit=10, max_scan=300, chunk=64)
    assert [m["id"] for m in page["messages"]] == ["rare-1"]
    assert page["scanned"] == 300  # short, and goes on
    assert page["next"] is not None
    page = list_pending(
        store,
        ListFilter(id_prefix="rare"),
        limit=10,
        after=decode_cursor(page["next"]),
        max_scan=300,
        chunk=64,
    )
    assert page["messages"] == []  # empty, and goes on
    assert page["next"] is not None
    listed, pages = walk(store, ListFilter(id_prefix="rare"), 10, max_scan=300, chunk=64)
    assert [m["id"] for m in listed] == ["rare-1", "rare-2"]
    assert pages == 4  # 1000 entries, 300 a page


def test_the_cursor_is_opaque_and_checked() -> None:
    key = bytes(range(28))
    assert decode_cursor(encode_cursor(key)) == key
    assert "=" not in encode_cursor(key)
    for bad in ("nope", "AAAA", encode_cursor(key) + "x", "!!!!"):
        with pytest.raises(QueryError) as caught:
            decode_cursor(bad)
        assert caught.value.status == 400
        assert caught.value.field == "cursor"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"state": "delivered"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": str(LIST_MAX + 1)}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "\u00b2"}, "limit"),  # a digit to str.isdigit, not to int()
        ({"due_before": "tomorrow"}, "due_before"),
        ({"cursor": "xyz"}, "cursor"),
    ],
)
def test_a_bad_parameter_is_400_naming_it(params: dict[str, str], field: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse_listing(params)
    assert caught.value.status == 400
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ":")


def test_parameters_default_and_parse() -> None:
    flt, limit, after = parse_listing({})
    assert (flt, limit, after) == (ListFilter(), 100, None)
    flt, limit, _ = parse_listing(
        {"due_before": "2027-01-01T00:00:00Z", "limit": "1000", "topic": "t", "owner": "User:a"}
    )
    assert flt.due_before_ms == 1_798_761_600_000
    assert limit == LIST_MAX
    assert flt.topic == "t"
    assert flt.owner == "User:a"


def test_the_replica_serves_the_listing_on_its_port(store: Store) -> None:
    fill(store, [sched(f"m-{i}", T0 + i, owner="User:alice" if i % 2 else None) for i in range(5)])
    answers = Answers(store, "replica-1", max_scan=1000)
    answers.attach(role=lambda: "master", lag=lambda: 0, clock=lambda: NOW)
    app = health.app(CollectorRegistry(), lambda: None, lambda: None, answers)
    transport = httpx.WSGITransport(app=app)
    with httpx.Client(transport=transport, base_url="http://replica") as client:
        r = client.get("/v1/messages", params={"limit": "2"})
        assert r.status_code == 200
        doc = r.json()
        assert [m["id"] for m in doc["messages"]] == ["m-0", "m-1"]
        assert doc["answered_by"] == "replica-1"
        assert doc["role"] == "master"
        r = client.get("/v1/messages", params={"cursor": doc["next"]})
        assert [m["id"] for m in r.json()["messages"]] == ["m-2", "m-3", "m-4"]
        assert r.json()["next"] is None
        r = client.get("/v1/messages", params={"owner": "User:alice"})
        assert [m["id"] for m in r.json()["messages"]] == ["m-1", "m-3"]
        r = client.get("/v1/messages", params={"limit": "5000"})
        assert r.status_code == 400
        assert r.json()["field"] == "limit"
        assert client.get("/v1/messages/m-1").json()["state"] == "pending"  # still served
        assert json.loads(client.delete("/v1/messages").content)["error"]


def test_shards_pages_merge_into_the_one_store_listing(tmp_path: Path) -> None:
    messages = mixed(400, seed=3)
    whole = Store(tmp_path / "whole")
    shards = [Store(tmp_path / "s0"), Store(tmp_path / "s1")]
    try:
        # One buffer partition per shard, the whole store holding both partitions.
        for part in (0, 1):
            mine = [m for i, m in enumerate(messages) if i % 2 == part]
            fill(whole, mine, partition=part)
            fill(shards[part], mine, partition=part)
        flt = ListFilter(id_prefix="cust-a")
        reference, _ = walk(whole, flt, 1000)
        for limit, max_scan in ((37, 200_000), (37, 50), (5, 11)):
            merged: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                after = None if cursor is None else decode_cursor(cursor)
                docs = [
                    list_pending(s, flt, limit=limit, after=after, max_scan=max_scan, chunk=9)
                    for s in shards
                ]
                page = merge_pages(docs, limit)
                assert len(page["messages"]) <= limit
                merged.extend(page["messages"])
                cursor = page["next"]
                if cursor is None:
                    break
            assert [m["id"] for m in merged] == [m["id"] for m in reference], (limit, max_scan)
    finally:
        whole.close()
        for s in shards:
            s.close()


def test_the_proxy_lists_two_shards_merged_and_checks_its_parameters(tmp_path: Path) -> None:
    """``GET /v1/messages`` on the proxy (proxy/http/queries.py) over two shards' replicas
    (zk/replica_api.py's list_pending), auth off: everyone's messages, pages merged."""
    messages = mixed(120, seed=5)
    shards = [Store(tmp_path / "s0"), Store(tmp_path / "s1")]
    try:
        for part in (0, 1):
            fill(shards[part], [m for i, m in enumerate(messages) if i % 2 == part], part)
        with serving(shards[0], NOW) as p0, serving(shards[1], NOW) as p1:
            app = proxy_app(
                GivenReplicas(
                    [Replica("s0", "master", 0, "127.0.0.1", p0)],
                    [Replica("s1", "master", 0, "127.0.0.1", p1)],
                )
            )
            seen: list[dict[str, Any]] = []
            url = "/v1/messages?state=pending&topic=orders&limit=25"
            while True:
                resp = proxy_get(app, url)
                assert resp.status_code == 200, resp.text
                doc = resp.json()
                assert len(doc["messages"]) <= 25
                seen += doc["messages"]
                if doc["next"] is None:
                    break
                url = f"/v1/messages?topic=orders&limit=25&cursor={doc['next']}"
            by_key = sorted(
                ((m.deliver_at_ms, i % 2, i // 2), m.id)
                for i, m in enumerate(messages)
                if m.topic == "orders"
            )
            assert [m["id"] for m in seen] == [msg_id for _, msg_id in by_key]
            for query, field in (
                ("limit=1001", "limit"),
                ("limit=0", "limit"),
                ("limit=%C2%B2", "limit"),
                ("state=cancelled", "state"),
                ("cursor=abc", "cursor"),
                ("due_before=1700000000", "due_before"),  # seconds: refused as such
            ):
                resp = proxy_get(app, f"/v1/messages?{query}")
                assert resp.status_code == 400, query
                assert resp.json()["field"] == field, query
    finally:
        for s in shards:
            s.close()


def test_the_timeline_counts_only_a_topic_or_id_prefix_when_asked(tmp_path: Path) -> None:
    """GET /v1/pending's optional topic and id_prefix (the console's counts per bucket of a
    listing's filters), on the replica and through the proxy over two shards."""
    messages = mixed(120, seed=9)
    shards = [Store(tmp_path / "s0"), Store(tmp_path / "s1")]
    try:
        for part in (0, 1):
            fill(shards[part], [m for i, m in enumerate(messages) if i % 2 == part], part)
        whole = timeline(shards[0], NOW - 60_000, 10_000, 3_600_000, max_scan=1000)
        only = timeline(
            shards[0], NOW - 60_000, 10_000, 3_600_000, max_scan=1000, topic="refunds",
            id_prefix="cust-b",
        )  # fmt: skip
        ours = [m for i, m in enumerate(messages) if i % 2 == 0]
        assert whole["counted"] == whole["scanned"] == len(ours)
        match = [m for m in ours if m.topic == "refunds" and m.id.startswith("cust-b")]
        assert only["counted"] == len(match) > 0
        assert only["scanned"] == len(ours)
        assert only["topics"] == {"refunds": len(match)}
        with serving(shards[0], NOW) as p0, serving(shards[1], NOW) as p1:
            app = proxy_app(
                GivenReplicas(
                    [Replica("s0", "master", 0, "127.0.0.1", p0)],
                    [Replica("s1", "master", 0, "127.0.0.1", p1)],
                )
            )
            resp = proxy_get(app, "/v1/pending?bucket=10s&horizon=1d&topic=orders")
            assert resp.status_code == 200, resp.text
            assert resp.json()["topics"] == {"orders": 60}
            resp = proxy_get(app, "/v1/pending?bucket=10s&horizon=1d&id_prefix=cust-b")
            assert resp.json()["counted"] == len([m for m in messages if m.id.startswith("cust-b")])
    finally:
        for s in shards:
            s.close()
