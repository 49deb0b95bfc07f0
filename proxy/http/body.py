"""The HTTP API's request bodies: a size limit, a deadline, and the request budget.

``BodyLimit`` is the ASGI middleware in front of the app (after authentication: an
unauthenticated body is never read):

- a ``Content-Length`` over ``max_request_bytes`` is answered 413 before anything is read, and a
  body without one (chunked) that grows over it is answered 413 as it arrives;
- the body must have arrived ``http_body_timeout_ms`` after the route first asks for it, else
  408; a client that announces a large body and sends it slowly holds the request that long;
- each piece of the body reserves its own size of the process-wide request budget
  (``max_buffered_request_bytes``, proxy/budget.py, shared with the Kafka listener) as it
  arrives, waiting while it does not fit (uvicorn then stops reading that socket), until the
  deadline; all of it is given back when the request is answered. The announced
  ``Content-Length`` reserves nothing: a body holds only what was actually sent.

Runs on the proxy's asyncio loop, like the rest of the HTTP API.
"""

from __future__ import annotations

import asyncio

from fastapi import HTTPException

from kdelay.errors import KdelayError
from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.http.errors import ASGIApp, Message, Receive, Scope, Send, problem

__all__ = ["BodyLimit", "BodyTimeoutError", "BodyTooLargeError"]


class BodyTooLargeError(KdelayError, HTTPException):
    """A body grew over ``max_request_bytes``, or a piece of it over the budget (413)."""


class BodyTimeoutError(KdelayError, HTTPException):
    """The body did not arrive within ``http_body_timeout_ms`` (408)."""


class BodyLimit:
    """ASGI middleware: the body's size limit, deadline and budget (module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        budget: RequestBudget | None,
        timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        limit = self.max_bytes
        if length is not None and length > limit:
            answer = problem(
                413, f"body: {length:,} bytes, over the limit max_request_bytes={limit:,}"
            )
            await answer(scope, receive, send)
            return
        reserved = 0
        seen = 0
        deadline: float | None = None
        loop = asyncio.get_running_loop()

        async def counted() -> Message:
            nonlocal seen, reserved, deadline
            if deadline is None:
                deadline = loop.time() + self.timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
                    if message["type"] == "http.request":
                        size = len(message.get("body", b""))
                        seen += size
                        if seen > limit:
                            raise BodyTooLargeError(
                                413, f"body: over the limit max_request_bytes={limit:,}"
                            )
                        await self._reserve(size)
                        reserved += size
            except TimeoutError:
                raise BodyTimeoutError(
                    408,
                    f"body: {seen:,} of {length or 0:,} bytes arrived within "
                    f"http_body_timeout_ms={round(self.timeout_s * 1000)}",
                ) from None
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if reserved and self.budget is not None:
                self.budget.release(reserved)

    async def _reserve(self, size: int) -> None:
        budget = self.budget
        if budget is None or size == 0:
            return
        if size > budget.limit:
            raise BodyTooLargeError(
                413, f"body: a piece of {size:,} bytes is over max_buffered_request_bytes"
            )
        if not budget.try_acquire(size):
            await budget.acquire(size)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
