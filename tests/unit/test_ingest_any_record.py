"""Ingest survives any record in the buffer topic.

Whatever a buffer record holds -- written by another kdelay version, by hand, or corrupt --
ingest either applies it or stores it as a dead-letter entry, and goes on: a record that made
``Store.apply`` raise would crash-loop every replica, since each reads the whole topic.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdelay.buffer import ROUTE_HEADER, Cancel, Fate, Tombstone, encode
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.store.store import Store


def _message(offset: int, key: bytes | None, value: bytes | None, headers: Any) -> Message:
    return Message(
        topic="buf",
        partition=0,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=(TIMESTAMP_LOG_APPEND_TIME, 1_000),
    )


def _ingest_all(store: Store, messages: list[Message]) -> Metrics:
    metrics = Metrics()
    Ingest(ReplicaConfig(name="r", buffer_topic="buf"), store, metrics).apply(messages)
    return metrics


def _invalid(metrics: Metrics) -> float:
    get = metrics.registry.get_sample_value
    return sum(
        get("kdelay_replica_invalid_records_total", {"reason": r}) or 0.0
        for r in ("undecodable", "unstorable")
    )


def test_a_cancel_whose_id_is_64_kib_becomes_a_dead_letter_entry(tmp_path: Path) -> None:
    cancel = encode(Cancel("x" * 65_536, "u-cancel"))
    store = Store(tmp_path / "db")
    try:
        metrics = _ingest_all(store, [_message(0, cancel.key, cancel.value, cancel.headers)])
        assert store.offsets() == {0: 1}
        assert _invalid(metrics) == 1
    finally:
        store.close()


def test_a_tombstone_with_an_integer_past_64_bits_becomes_a_dead_letter_entry(
    tmp_path: Path,
) -> None:
    tomb = encode(Tombstone("m", 0, "u-m", Fate("delivered", "t", 0, 5, 1, 1, None)))
    route = json.loads(tomb.headers[-1][1] or b"")
    route["to"] = 2**70  # orjson, which the replicas re-encode fates with, stops at 64 bits
    headers = [(ROUTE_HEADER, json.dumps(route).encode())]
    store = Store(tmp_path / "db")
    try:
        metrics = _ingest_all(store, [_message(0, tomb.key, tomb.value, headers)])
        assert store.offsets() == {0: 1}
        assert _invalid(metrics) == 1
    finally:
        store.close()


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.integers(65_530, 65_540).map(lambda n: "a" * n),  # ids past what a replica keeps
    st.lists(st.integers(), max_size=2),
)
_FIELDS = ("i", "t", "p", "k", "n", "d", "r", "s", "rp", "oc", "o", "x", "tp", "to", "ts")
_ROUTES = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 2, 3, 99]),
        "op": st.sampled_from(["schedule", "cancel", "done", "?"]),
    },
    optional=dict.fromkeys(_FIELDS, _SCALARS),
)
_RECORDS = st.tuples(
    st.one_of(
        st.none(), st.binary(max_size=40), st.integers(65_536, 65_600).map(lambda n: b"k" * n)
    ),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3
    ),
    st.one_of(st.none(), _ROUTES),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(_RECORDS, min_size=1, max_size=6))
def test_ingest_applies_or_dead_letters_any_record(
    batch: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], Any]],
) -> None:
    messages = []
    for offset, (key, value, headers, route) in enumerate(batch):
        own: list[tuple[str, bytes | None]] = list(headers)
        if route is not None:
            own.append((ROUTE_HEADER, json.dumps(route).encode()))
        messages.append(_message(offset, key, value, own))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "db")
        try:
            _ingest_all(store, messages)  # must not raise
            assert store.offsets() == {0: len(messages)}
            # and the store can still be read and released from
            store.due(2**62, limit=100)
        finally:
            store.close()
