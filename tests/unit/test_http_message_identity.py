"""The identity of a posted message (proxy/http/message_records.py): a POST with an id derives its
buffer key from every field of its body, so the same body sent again is a retry (the same key) and a
body that differs in any field is a new message (``repeat`` was left out). The fields are
:class:`MessageIn`'s, so a field added later must be listed here."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdelay import headers as h
from kdelay.proxy.http.message_records import MessageIn, route_message

NOW = 1_800_000_000_000
POLICY = h.DelayPolicy()
#: Every field set, one timing field (delay_ms) and value rather than value_b64.
BASE: dict[str, Any] = {
    "topic": "orders",
    "partition": 1,
    "key": "k",
    "value": "v",
    "headers": {"trace": "t1"},
    "delay_ms": 60_000,
    "id": "order-1",
    "repeat": "R2/PT1S",
}
#: The fields a field's values replace in BASE (they cannot be given with it).
EXCLUDES = {
    "value_b64": ("value",),
    "deliver_at": ("delay_ms",),
    "delay_level": ("delay_ms",),
}

texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
instants = st.integers(NOW - 10**9, NOW + 10**9)
#: Valid values of each field of a posted message.
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "topic": st.from_regex(r"[a-z][a-z0-9._-]{0,9}", fullmatch=True),
    "partition": st.none() | st.integers(0, 2**31 - 1),
    "key": st.none() | texts,
    "value": st.none() | texts,
    "value_b64": st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
    "headers": st.none()
    | st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), texts, max_size=3),
    "delay_ms": st.integers(0, 10**9),
    "deliver_at": instants
    | instants.map(lambda ms: datetime.fromtimestamp(ms / 1000, UTC).isoformat()),
    "delay_level": st.integers(1, 18),
    "id": st.from_regex(r"[A-Za-z0-9-]{1,12}", fullmatch=True),
    "repeat": st.none() | st.sampled_from(["R2/PT1S", "R3/PT1S", "R5/PT1M", "exp:1s,2,1m,8"]),
}


def buffer_key(body: dict[str, Any]) -> bytes | None:
    return route_message(MessageIn.model_validate(body), NOW, POLICY, buffer_partitions=6).key


def test_every_field_of_the_body_is_covered() -> None:
    assert set(FIELD_VALUES) == set(MessageIn.model_fields)
    assert set(BASE) | {"value_b64", "deliver_at", "delay_level"} == set(MessageIn.model_fields)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # regex strategies
@given(st.data())
def test_a_body_that_differs_in_any_field_is_another_message(data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(MessageIn.model_fields)))
    # Told apart as the JSON they are sent as: headers in another order are another body too.
    pair = st.lists(FIELD_VALUES[field], min_size=2, max_size=2, unique_by=json.dumps)
    one, other = data.draw(pair)
    base = {k: v for k, v in BASE.items() if k not in EXCLUDES.get(field, ())}
    first = buffer_key({**base, field: one})
    assert buffer_key({**base, field: one}) == first  # the same body again: a retry
    assert buffer_key({**base, field: other}) != first


def test_another_repeat_is_another_message() -> None:
    """The case found from outside: R2/PT1S then R3/PT1S with the same id."""
    assert buffer_key(BASE) != buffer_key({**BASE, "repeat": "R3/PT1S"})
    assert buffer_key(BASE) != buffer_key({**BASE, "repeat": None})


def test_the_same_value_as_text_or_base64_and_a_field_at_its_default_are_the_same_body() -> None:
    """What is not another message: the same bytes given as ``value`` or ``value_b64``, and a
    field given as its default (null) rather than left out."""
    assert buffer_key(BASE) == buffer_key({**BASE, "value": None, "value_b64": "dg=="})
    assert buffer_key({**BASE, "partition": None}) == buffer_key(
        {k: v for k, v in BASE.items() if k != "partition"}
    )
