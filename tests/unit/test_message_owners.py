"""Message owners (issue 36 point 3): who is a kdelay administrator, the owner stamped in buffer
records, and the cancel rule with owners."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from proxy.authorization import Access, AclCache, TopicAccess
from proxy.sasl import Principal

BUFFER = "__kdelay_buffer"


class _Link:
    """A link answering Metadata with fixed authorized operations for the buffer topic."""

    def __init__(self, error_code: int, operations: set[int] | None) -> None:
        self.error_code = error_code
        self.operations = operations
        self.requests = 0

    async def request(self, request: Any) -> Any:
        self.requests += 1
        topic = SimpleNamespace(
            name=BUFFER,
            error_code=self.error_code,
            authorized_operations=self.operations,
            partitions=[],
        )
        return SimpleNamespace(cluster_id="c", topics=[topic])


def _admin(error_code: int, operations: set[int] | None) -> bool:
    link = _Link(error_code, operations)
    access = TopicAccess(Principal("alice"), link, AclCache(60.0))  # type: ignore[arg-type]
    return asyncio.run(access.admin(BUFFER))


def test_an_administrator_is_allowed_alter_or_all_on_the_buffer_topic() -> None:
    assert _admin(0, {3, 7, 8})  # READ, ALTER, DESCRIBE
    assert _admin(0, {2})  # ALL
    assert not _admin(0, {3, 4, 8})  # READ, WRITE, DESCRIBE
    assert not _admin(29, None)  # may not even DESCRIBE it
    assert not Access(0, None).alterable


def test_the_admin_answer_is_cached_per_principal() -> None:
    link = _Link(0, {7})
    cache = AclCache(60.0)
    access = TopicAccess(Principal("alice"), link, cache)  # type: ignore[arg-type]

    async def twice() -> list[bool]:
        return [await access.admin(BUFFER), await access.admin(BUFFER)]

    assert asyncio.run(twice()) == [True, True]
    assert link.requests == 1
