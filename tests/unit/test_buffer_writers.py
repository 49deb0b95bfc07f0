"""Who may WRITE the buffer topic, decided from Kafka's bindings (release/buffer_writers.py)."""

from __future__ import annotations

import concurrent.futures
from types import SimpleNamespace
from typing import Any

from pydantic import SecretStr

from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.release.buffer_writers import (
    BufferWriters,
    combined,
    foreign_writers,
    writers_of,
)
from tests.support.fakes import FakeClock

TOPIC = "__kdelay_buffer"
WRITERS = frozenset({"User:kdelay-proxy", "User:kdelay-replica"})


def _b(
    principal: str,
    operation: str = "WRITE",
    *,
    name: str = TOPIC,
    pattern: str = "LITERAL",
    permission: str = "ALLOW",
    host: str = "*",
) -> Any:
    return SimpleNamespace(
        restype="TOPIC",
        resource_pattern_type=pattern,
        name=name,
        principal=principal,
        operation=operation,
        permission_type=permission,
        host=host,
    )


def _principals(bindings: list[Any]) -> list[str]:
    return [f.rule.principal for f in foreign_writers(bindings, TOPIC, WRITERS)]


def test_kdelays_writers_and_other_operations_are_not_foreign() -> None:
    bindings = [
        _b("User:kdelay-proxy"),
        _b("User:kdelay-replica", "ALL"),
        _b("User:verifier", "READ"),
        _b("User:carol", "ALTER"),
    ]
    assert _principals(bindings) == []


def test_write_or_all_by_literal_prefixed_or_wildcard_is_foreign() -> None:
    bindings = [
        _b("User:mallory"),
        _b("User:eve", "ALL", name="__kdelay", pattern="PREFIXED"),
        _b("User:trent", name="*"),
        _b("User:*"),
    ]
    assert _principals(bindings) == ["User:mallory", "User:eve", "User:trent", "User:*"]


def test_a_deny_takes_a_writer_back() -> None:
    assert _principals([_b("User:mallory"), _b("User:mallory", permission="DENY")]) == []
    assert _principals([_b("User:*"), _b("User:*", permission="DENY")]) == []
    # A DENY for one principal does not close a door opened to everyone.
    assert _principals([_b("User:*"), _b("User:mallory", permission="DENY")]) == ["User:*"]


def test_the_remove_command_names_the_binding_exactly() -> None:
    (found,) = foreign_writers(
        [_b("User:eve", "ALL", name="__kd", pattern="PREFIXED", host="10.0.0.9")], TOPIC, WRITERS
    )
    command = found.remove_command("kafka:9093")
    assert "--remove --allow-principal User:eve --allow-host 10.0.0.9" in command
    assert "--operation All --topic __kd --resource-pattern-type prefixed" in command


def test_writers_are_the_setting_the_own_login_and_super_users() -> None:
    cfg = ReplicaConfig(
        name="r",
        buffer_writers="User:px1, px2",
        super_users="User:admin",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_username="rep",
        kafka_sasl_password=SecretStr("pw"),
    )
    assert writers_of(cfg) == {"User:px1", "User:px2", "User:admin", "User:rep"}


class _Asks:
    def __init__(self) -> None:
        self.answers: list[Any] = []
        self.asked = 0

    def __call__(self) -> concurrent.futures.Future[Any]:
        self.asked += 1
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(list(self.answers))
        return future


class _Gauge:
    value = -1.0

    def set(self, value: float) -> None:
        self.value = value


def test_the_hold_follows_the_bindings_asked_every_interval() -> None:
    asks, clock = _Asks(), FakeClock()
    metrics = SimpleNamespace(buffer_foreign_writers=_Gauge())
    hold = BufferWriters(asks, TOPIC, WRITERS, interval_ms=5_000, metrics=metrics, clock=clock)
    assert hold() is None
    asks.answers = [_b("User:mallory")]
    assert hold() is None  # the answer is reused until the interval is over
    clock.advance(5.0)
    hold()  # asks again; the answer is harvested by the next call
    reason = hold()
    assert reason is not None
    assert "User:mallory" in reason
    assert metrics.buffer_foreign_writers.value == 1
    asks.answers = []
    clock.advance(5.0)
    hold()
    assert hold() is None
    assert metrics.buffer_foreign_writers.value == 0


def test_the_hold_holds_when_kafka_stops_answering() -> None:
    clock = FakeClock()
    futures: list[concurrent.futures.Future[Any]] = []

    def ask() -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if not futures:
            future.set_result([])
        futures.append(future)
        return future

    hold = BufferWriters(ask, TOPIC, WRITERS, interval_ms=1_000, clock=clock, ask_timeout_s=1.0)
    assert hold() is None
    clock.advance(2.0)
    assert hold() is None  # asked again: not answered yet, still within the bound
    clock.advance(2.0)
    reason = hold()
    assert reason is not None
    assert "not known" in reason


def test_combined_asks_every_hold_and_gives_the_first_reason() -> None:
    calls: list[str] = []

    def a() -> str | None:
        calls.append("a")
        return "skew"

    def b() -> str | None:
        calls.append("b")
        return "writers"

    assert combined(a, b)() == "skew"
    assert calls == ["a", "b"]
