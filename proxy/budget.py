"""The process-wide cap on request bytes held in memory (``max_buffered_request_bytes``).

``max_request_bytes`` bounds one request; this bounds all of them together. Before the Kafka
listener reads a frame body of N bytes it reserves N bytes here (proxy/kafka/server.py), and an HTTP
request with a ``Content-Length`` reserves its body the same way (proxy/http/errors.py); the
reservation is given back when the request has been answered (or dropped). A connection whose
reservation does not fit *waits*, reading nothing more from its socket: the kernel's buffers and
then the client's own writes fill up, which is backpressure on that client, not a crash and not
a stall of everyone else. Without it, ten connections each holding a 99 MiB partial frame drove
one proxy to 1.2 GB RSS (README "Limits").

Grants are first fit in arrival order: when bytes are released, each waiter that now fits is
granted, in order, and a new request that fits is granted at once even while larger ones wait.
So a few huge frames cannot hold up ordinary small requests; a huge frame waits until enough
is free (it may wait behind a steady stream of small requests only while the budget is nearly
full of other huge ones).

Concurrency: every method runs on the proxy's asyncio loop thread (the Kafka listener and the
HTTP API share it); nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from kdelay.proxy.metrics import ProxyMetrics


class RequestBudget:
    """Bytes of requests in memory, at most ``limit`` (see the module docstring)."""

    def __init__(self, limit: int, metrics: ProxyMetrics | None = None) -> None:
        if limit < 1:
            raise ValueError(f"max_buffered_request_bytes must be at least 1, got {limit}")
        self.limit = limit
        #: Bytes reserved now.
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        if metrics is not None:
            # Read at scrape time: nothing on the per-request path touches a metric.
            metrics.buffered_request_bytes.set_function(lambda: self.used)
            metrics.buffered_request_waiting.set_function(lambda: len(self._waiters))
            metrics.buffered_request_limit.set(limit)

    @property
    def waiting(self) -> int:
        """Requests waiting for their reservation."""
        return len(self._waiters)

    def try_acquire(self, n: int) -> bool:
        """Reserve ``n`` bytes if they fit now; whether they were reserved."""
        if self.used + n <= self.limit:
            self.used += n
            return True
        return False

    async def acquire(self, n: int) -> None:
        """Reserve ``n`` bytes, waiting until they fit. ``n`` above the limit can never fit:
        ValueError (the per-request limit, which is at most this one, refuses it first)."""
        if n > self.limit:
            raise ValueError(
                f"a request of {n:,} bytes is over max_buffered_request_bytes={self.limit:,}"
            )
        if self.try_acquire(n):
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, granted)
        self._waiters.append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(n)  # granted just as the waiter was cancelled: give it back
            else:
                with contextlib.suppress(ValueError):  # a release may have dropped it already
                    self._waiters.remove(entry)
            raise

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes and grant the waiters that now fit."""
        self.used -= n
        assert self.used >= 0, "released more than was reserved"
        if not self._waiters:
            return
        keep: deque[tuple[int, asyncio.Future[None]]] = deque()
        for size, future in self._waiters:
            if future.done():
                continue
            if self.used + size <= self.limit:
                self.used += size
                future.set_result(None)
            else:
                keep.append((size, future))
        self._waiters = keep
