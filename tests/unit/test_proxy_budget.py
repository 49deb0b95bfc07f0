"""The process-wide request budget (proxy/budget.py): waits instead of overcommitting, grants
first fit in arrival order, gives back what a cancelled waiter was granted, and is exported."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.metrics import ProxyMetrics

DEADLINE_S = 10.0


async def _settle() -> None:
    """Let every task that can run now run."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_request_that_does_not_fit_waits_until_bytes_are_released() -> None:
    async def run() -> None:
        budget = RequestBudget(100)
        await budget.acquire(70)
        waiting = asyncio.create_task(budget.acquire(50))
        await _settle()
        assert not waiting.done()
        assert (budget.used, budget.waiting) == (70, 1)
        budget.release(70)
        async with asyncio.timeout(DEADLINE_S):
            await waiting
        assert (budget.used, budget.waiting) == (50, 0)

    asyncio.run(run())


def test_small_requests_pass_a_large_one_that_waits() -> None:
    async def run() -> None:
        budget = RequestBudget(100)
        await budget.acquire(60)
        large = asyncio.create_task(budget.acquire(80))
        await _settle()
        async with asyncio.timeout(DEADLINE_S):
            await budget.acquire(30)  # fits beside the 60: granted at once
        assert not large.done()
        small = asyncio.create_task(budget.acquire(20))  # does not fit (90 used): waits too
        await _settle()
        budget.release(60)  # 30 used: the large one still does not fit, the small one does
        async with asyncio.timeout(DEADLINE_S):
            await small
        assert not large.done()
        budget.release(30)  # 20 used: now the large one fits
        async with asyncio.timeout(DEADLINE_S):
            await large
        assert (budget.used, budget.waiting) == (100, 0)

    asyncio.run(run())


def test_a_cancelled_waiter_takes_nothing() -> None:
    async def run() -> None:
        budget = RequestBudget(100)
        await budget.acquire(100)
        cancelled = asyncio.create_task(budget.acquire(10))
        other = asyncio.create_task(budget.acquire(10))
        await _settle()
        cancelled.cancel()
        budget.release(100)  # grants both before the cancellation is seen: one is given back
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        async with asyncio.timeout(DEADLINE_S):
            await other
        assert (budget.used, budget.waiting) == (10, 0)

    asyncio.run(run())


def test_more_than_the_limit_can_never_be_reserved() -> None:
    async def run() -> None:
        with pytest.raises(ValueError, match="max_buffered_request_bytes=100"):
            await RequestBudget(100).acquire(101)

    asyncio.run(run())


def test_the_budget_is_exported() -> None:
    async def run() -> None:
        metrics = ProxyMetrics()
        budget = RequestBudget(1024, metrics)
        await budget.acquire(1000)
        waiting = asyncio.create_task(budget.acquire(100))
        await _settle()
        text = generate_latest(metrics.registry).decode()
        assert "kdelay_proxy_buffered_request_bytes 1000.0" in text
        assert "kdelay_proxy_buffered_request_limit_bytes 1024.0" in text
        assert "kdelay_proxy_buffered_request_waiting 1.0" in text
        budget.release(1000)
        await waiting

    asyncio.run(run())
