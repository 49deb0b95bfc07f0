"""Sequence bookkeeping of the proxy's idempotent-producer support (KIP-98 semantics)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import kafka.errors as kerr
import pytest

from kdelay.proxy.kafka.idempotence import PartitionResult, ProducerRegistry, Verdict
from kdelay.proxy.metrics import ProxyMetrics


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def test_in_order_batches_are_accepted(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=100)
    pid, epoch = reg.init_producer()
    assert (pid, epoch) == (100, 0)
    first = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=2, loop=loop)
    assert first.verdict is Verdict.ACCEPT
    second = reg.check(pid, epoch, "t", 0, base_seq=3, last_seq=4, loop=loop)
    assert second.verdict is Verdict.ACCEPT


def test_retry_returns_the_first_result(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    pid, epoch = reg.init_producer()
    first = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=1, loop=loop)
    assert first.entry is not None
    reg.complete(pid, "t", 0, first.entry, PartitionResult(0, 42))
    again = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=1, loop=loop)
    assert again.verdict is Verdict.DUPLICATE
    assert again.entry is not None
    assert again.entry.result.result() == PartitionResult(0, 42)


def test_gap_is_out_of_order_and_old_batch_is_duplicate(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    pid, epoch = reg.init_producer()
    for base in range(0, 12, 2):  # six batches: the first falls out of the recent window
        check = reg.check(pid, epoch, "t", 0, base_seq=base, last_seq=base + 1, loop=loop)
        assert check.verdict is Verdict.ACCEPT
    gap = reg.check(pid, epoch, "t", 0, base_seq=20, last_seq=20, loop=loop)
    assert gap.error is not None
    assert gap.error.error_code == kerr.OutOfOrderSequenceNumberError.errno
    old = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=1, loop=loop)
    assert old.error is not None
    assert old.error.error_code == kerr.DuplicateSequenceNumberError.errno


def test_old_epoch_is_fenced_after_a_bump(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    pid, epoch = reg.init_producer()
    assert reg.init_producer(pid, epoch) == (pid, epoch + 1)
    stale = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert stale.error is not None
    assert stale.error.error_code == kerr.InvalidProducerEpochError.errno
    fresh = reg.check(pid, epoch + 1, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert fresh.verdict is Verdict.ACCEPT


def test_retriable_failure_lets_the_retry_through(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    pid, epoch = reg.init_producer()
    first = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert first.entry is not None
    reg.complete(pid, "t", 0, first.entry, PartitionResult(kerr.RequestTimedOutError.errno))
    retry = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert retry.verdict is Verdict.ACCEPT


def test_permanent_failure_consumes_the_sequence(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    pid, epoch = reg.init_producer()
    first = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert first.entry is not None
    reg.complete(pid, "t", 0, first.entry, PartitionResult(kerr.InvalidRecordError.errno))
    assert reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=0, loop=loop).verdict is (
        Verdict.DUPLICATE
    )
    assert reg.check(pid, epoch, "t", 0, base_seq=1, last_seq=1, loop=loop).verdict is (
        Verdict.ACCEPT
    )


def test_unknown_producer_is_adopted_at_its_sequence(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    adopted = reg.check(777, 3, "t", 0, base_seq=50, last_seq=59, loop=loop)
    assert adopted.verdict is Verdict.ACCEPT
    assert reg.check(777, 3, "t", 0, base_seq=60, last_seq=60, loop=loop).verdict is (
        Verdict.ACCEPT
    )


def test_sequence_wraps_at_int32(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    top = 2**31 - 1
    assert reg.check(5, 0, "t", 0, base_seq=top - 1, last_seq=top, loop=loop).verdict is (
        Verdict.ACCEPT
    )
    assert reg.check(5, 0, "t", 0, base_seq=0, last_seq=0, loop=loop).verdict is Verdict.ACCEPT


# -- bounded memory: TTL and cap (the clock is injected) ----------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_producer_is_forgotten_after_the_ttl(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    metrics = ProxyMetrics()
    reg = ProducerRegistry(first_id=1, ttl_s=60, clock=clock, metrics=metrics)
    idle, epoch = reg.init_producer()
    busy, _ = reg.init_producer()
    first = reg.check(idle, epoch, "t", 0, base_seq=0, last_seq=1, loop=loop)
    assert first.entry is not None
    reg.complete(idle, "t", 0, first.entry, PartitionResult(0, 7))
    clock.now += 59
    reg.check(busy, 0, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert idle in reg  # idle 59 s: kept
    clock.now += 1
    reg.check(busy, 0, "t", 0, base_seq=1, last_seq=1, loop=loop)
    assert idle not in reg
    assert busy in reg
    value = metrics.registry.get_sample_value
    assert value("kdelay_proxy_producer_evictions_total", {"reason": "ttl"}) == 1
    assert value("kdelay_proxy_producer_states") == 1


def test_a_producer_returning_after_eviction_is_adopted(loop: asyncio.AbstractEventLoop) -> None:
    """What a forgotten producer sees (idempotence.py "Bounded memory"): no error; its next
    batch is adopted at its sequence; dedupe of a batch from before the gap is lost."""
    clock = Clock()
    reg = ProducerRegistry(first_id=1, ttl_s=60, clock=clock)
    pid, epoch = reg.init_producer()
    first = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=4, loop=loop)
    assert first.entry is not None
    reg.complete(pid, "t", 0, first.entry, PartitionResult(0, 7))
    clock.now += 3600
    nxt = reg.check(pid, epoch, "t", 0, base_seq=5, last_seq=5, loop=loop)
    assert nxt.verdict is Verdict.ACCEPT
    later = reg.check(pid, epoch, "t", 0, base_seq=6, last_seq=6, loop=loop)
    assert later.verdict is Verdict.ACCEPT
    clock.now += 3600
    # A retry of the very first batch after another gap is written again (adopted at 0).
    assert reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=4, loop=loop).verdict is (
        Verdict.ACCEPT
    )
    # A KIP-360 epoch bump of a forgotten producer gets a fresh id.
    clock.now += 3600
    assert reg.init_producer(pid, epoch) == (2, 0)


def test_the_least_recently_used_producer_goes_over_the_cap(
    loop: asyncio.AbstractEventLoop,
) -> None:
    clock = Clock()
    metrics = ProxyMetrics()
    reg = ProducerRegistry(first_id=1, max_producers=3, clock=clock, metrics=metrics)
    pids = [reg.init_producer()[0] for _ in range(3)]
    clock.now += 1
    reg.check(pids[0], 0, "t", 0, base_seq=0, last_seq=0, loop=loop)  # 0 is used again
    newcomer, _ = reg.init_producer()
    assert len(reg) == 3
    assert pids[1] not in reg
    assert pids[0] in reg
    assert pids[2] in reg
    assert newcomer in reg
    reg.check(99, 0, "u", 1, base_seq=10, last_seq=10, loop=loop)  # an adopted id counts too
    assert pids[2] not in reg
    assert len(reg) == 3
    evicted = {"reason": "cap"}
    assert metrics.registry.get_sample_value("kdelay_proxy_producer_evictions_total", evicted) == 2


def test_a_batch_in_flight_when_its_producer_is_evicted_still_completes(
    loop: asyncio.AbstractEventLoop,
) -> None:
    reg = ProducerRegistry(first_id=1, max_producers=1)
    pid, epoch = reg.init_producer()
    check = reg.check(pid, epoch, "t", 0, base_seq=0, last_seq=0, loop=loop)
    assert check.entry is not None
    reg.init_producer()  # evicts pid
    reg.complete(pid, "t", 0, check.entry, PartitionResult(kerr.RequestTimedOutError.errno))
    assert check.entry.result.result().error_code == kerr.RequestTimedOutError.errno
