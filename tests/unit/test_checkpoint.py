"""The checkpoint rule and document (kdelay/checkpoint.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.checkpoint import NOTHING, Checkpoint, CheckpointFormatError, CheckpointRecord


def test_covers_only_records_below_the_offsets_and_due_by_the_time() -> None:
    cp = Checkpoint(100, {0: 5})
    assert cp.covers(0, 4, 100)
    assert not cp.covers(0, 5, 100)  # not yet ingested when the claim was made
    assert not cp.covers(0, 4, 101)  # not yet due
    assert not cp.covers(1, 0, 0)  # a partition the claim does not name
    assert not NOTHING.covers(0, 0, 0)


def test_the_document_is_the_one_kdelay_status_shows() -> None:
    record = CheckpointRecord(150, {10: 3, 2: 7}, epoch=4, writer="replica-1", written_at_ms=99)
    assert json.loads(record.encode()) == {
        "time_ms": 150,
        "offsets": {"2": 7, "10": 3},
        "epoch": 4,
        "writer": "replica-1",
        "written_at_ms": 99,
    }
    assert record.encode() == (
        b'{"time_ms":150,"offsets":{"2":7,"10":3},"epoch":4,"writer":"replica-1",'
        b'"written_at_ms":99}'
    )
    assert record.checkpoint == Checkpoint(150, {10: 3, 2: 7})


@given(
    st.builds(
        CheckpointRecord,
        time_ms=st.integers(-1, 2**62),
        offsets=st.dictionaries(st.integers(0, 2**31 - 1), st.integers(0, 2**62), max_size=8),
        epoch=st.integers(0, 2**31 - 1),
        writer=st.text(max_size=30),
        written_at_ms=st.integers(0, 2**62),
    )
)
def test_document_round_trips(record: CheckpointRecord) -> None:
    assert CheckpointRecord.decode(record.encode()) == record


@pytest.mark.parametrize("data", [b"", b"[]", b"{}", b'{"time_ms":"x"}', b"\xff"])
def test_anything_else_is_a_format_error(data: bytes) -> None:
    with pytest.raises(CheckpointFormatError, match="no valid checkpoint"):
        CheckpointRecord.decode(data)
