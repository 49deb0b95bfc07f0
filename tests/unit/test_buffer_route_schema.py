"""The route-header schema readers without kdelay.buffer (the Spark verifier) parse with."""

from __future__ import annotations

import json

import pytest

from kdelay.buffer import (
    OP_CANCEL,
    OP_DONE,
    OP_SCHEDULE,
    ROUTE_FIELDS,
    Cancel,
    Fate,
    Scheduled,
    Tombstone,
    decode,
    encode,
    route_schema,
)


@pytest.mark.parametrize(
    "record",
    [
        Scheduled("a", "t", 0, b"k", None, 1),
        Scheduled("a", "t", 0, b"k", None, 1, repeat="R5/PT1S", occurrence=2),
        Cancel("a"),
        Tombstone("a", 7),
        Tombstone("a", 7, "u", Fate("delivered", "t", 1, 9, 2, 3, 4)),
        Tombstone("a", 7, "u", Fate("dead_lettered", "t", 1, None, 2, 3, 4, "E: x", 1, "bob")),
    ],
)
def test_every_field_written_is_in_the_schema(record: Scheduled | Cancel | Tombstone) -> None:
    route = json.loads(encode(record).headers[-1][1] or b"")
    assert set(route) <= set(ROUTE_FIELDS)
    assert route["op"] in (OP_SCHEDULE, OP_CANCEL, OP_DONE)


def test_schema_ddl() -> None:
    assert route_schema("v", "op", "d") == "v INT, op STRING, d BIGINT"
    assert route_schema().count(",") == len(ROUTE_FIELDS) - 1
    with pytest.raises(ValueError, match="'zz'"):
        route_schema("zz")


def test_a_tombstones_fate_reads_back_whole() -> None:
    """What the master's tombstone tells every replica of a release (its history, too)."""
    fate = Fate("dead_lettered", "t", 1, None, 2, 3, 4, "MSG_SIZE_TOO_LARGE: big", 1, "bob")
    encoded = encode(Tombstone("a", 7, "u", fate))
    decoded = decode(encoded.key, encoded.value, encoded.headers)
    assert isinstance(decoded, Tombstone)
    assert decoded.fate == fate
