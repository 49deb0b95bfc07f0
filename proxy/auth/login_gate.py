"""The cap on logins the proxy works on at once (``max_concurrent_logins``).

A login costs the proxy a connection to upstream Kafka and its round trips, and for the HTTP
API's SCRAM logins the client's PBKDF2 (thousands of HMAC iterations, computed in a worker
thread, never on the event loop: proxy/auth/sasl_client.py). Both listeners draw on one gate: each
step of a login that makes the proxy work (opening its link and relaying the handshake, relaying
one SaslAuthenticate round, an HTTP login as a whole) holds a slot while it runs. A login that
finds every slot taken waits its turn, first come first served, for at most its own deadline
(the Kafka listener's login deadline, the HTTP API's ``broker_link_timeout_ms``), then fails:
the Kafka connection is closed, the HTTP request answered 503. A client that stalls between
rounds holds no slot, so a flood of logins slows the flood, while the event loop and every
logged-in client go on as before.

Concurrency: used from the asyncio loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kdelay.errors import KdelayError

__all__ = ["LoginGate", "LoginsBusyError"]


class LoginsBusyError(KdelayError):
    """No login slot came free within the caller's deadline."""


class LoginGate:
    """At most ``limit`` login steps at once (module docstring)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_concurrent_logins must be at least 1, got {limit}")
        self.limit = limit
        #: Steps running now, and waiting for a slot.
        self.running = 0
        self.waiting = 0
        self._slots = asyncio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def slot(self, timeout_s: float) -> AsyncIterator[None]:
        """Hold a slot for the block; raises LoginsBusyError when none is free in
        ``timeout_s``."""
        self.waiting += 1
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await self._slots.acquire()
        except TimeoutError:
            raise LoginsBusyError(
                f"{self.limit} logins were in progress for {timeout_s:.1f} s "
                f"(max_concurrent_logins={self.limit})"
            ) from None
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()
