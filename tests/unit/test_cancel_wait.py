"""proxy/http/cancel_wait.py: when a replica's answer decides a confirmed cancel (the master's, once
it applied the cancel), what each state answers, and ``wait``'s bounds."""

from __future__ import annotations

from typing import Any

import pytest

from kdelay.proxy.http.cancel_wait import MAX_WAIT_S, decide, parse_wait
from kdelay.zk.replica_api import ReplicaAnswer

P, OFFSET = 2, 41  # where the cancel was appended


def answer(
    status: int, role: str = "master", ingested: int = OFFSET + 1, **doc: Any
) -> ReplicaAnswer:
    body = {"role": role, "ingested_offsets": {str(P): ingested}, **doc}
    return ReplicaAnswer(status, body, "replica-1")


def test_only_the_masters_answer_after_the_cancel_decides() -> None:
    assert decide("x", answer(200, role="follower", state="cancelled"), P, OFFSET) is None
    assert decide("x", answer(200, ingested=OFFSET, state="pending"), P, OFFSET) is None
    assert decide("x", answer(404, ingested=OFFSET, error="id: none"), P, OFFSET) is None


@pytest.mark.parametrize(
    ("doc", "status", "body"),
    [
        ({"state": "cancelled"}, 200, {"id": "x", "state": "cancelled"}),
        (
            {"state": "delivered", "released_at": 5},
            409,
            {"id": "x", "state": "already_delivered", "delivered_at": 5},
        ),
        (
            {"state": "dead_lettered", "released_at": 6},
            409,
            {"id": "x", "state": "dead_lettered", "dead_lettered_at": 6},
        ),
    ],
)
def test_what_each_state_answers(doc: dict[str, Any], status: int, body: dict[str, Any]) -> None:
    decision = decide("x", answer(200, **doc), P, OFFSET)
    assert decision is not None
    assert (decision.status, decision.body) == (status, body)


def test_pending_after_the_cancel_is_409_not_cancelled_and_unknown_is_404() -> None:
    still = decide("x", answer(200, state="pending"), P, OFFSET)
    assert still is not None
    assert (still.status, still.body["state"]) == (409, "not_cancelled")
    unknown = decide("x", answer(404, error="id: no message 'x'"), P, OFFSET)
    assert unknown is not None
    assert (unknown.status, unknown.body["field"]) == (404, "id")


@pytest.mark.parametrize("text", ["x", "-0.5", "nan", "inf", str(MAX_WAIT_S + 1)])
def test_a_bad_wait_names_it(text: str) -> None:
    with pytest.raises(ValueError, match=r"^wait: "):
        parse_wait(text)


def test_a_good_wait() -> None:
    assert parse_wait(None) is None
    assert parse_wait("0") == 0
    assert parse_wait("2.5") == 2.5
