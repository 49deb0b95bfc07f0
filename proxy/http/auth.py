"""Who calls the HTTP API: the caller a route acts for, and what Kafka allows it.

The HTTP API authenticates with Kafka's own principals, the proxy keeping no
users: ``http_auth = "kafka"`` checks each request's ``Authorization`` header against Kafka
(proxy/http/login.py) before any route runs; ``http_auth = "none"`` (the default) leaves the API
open. Routes never look at headers themselves: they take the :class:`Caller` that
:func:`current_caller` gives them (a FastAPI dependency) and ask it.

- ``principal``: Kafka's form of the caller's name, ``"User:alice"``; None when the API is open.
- ``writable(topic)``: Kafka allows the principal WRITE on ``topic`` (asked on the caller's own
  authenticated connection to Kafka, cached for ``acl_cache_ms``).
- ``admin()``: the principal is a kdelay administrator: Kafka allows it ALTER on the buffer topic
  (``TopicAccess.admin``, proxy/auth/authorization.py), so Kafka's super users are administrators.

An open caller (auth off) may do everything: ``writable`` and ``admin`` are True.

Concurrency: everything runs on the proxy's asyncio loop (uvicorn's); a caller belongs to one
request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from fastapi import Request

from kdelay import logs
from kdelay.proxy.auth.authorization import TopicAccess
from kdelay.proxy.auth.broker_link import Link, LinkError
from kdelay.proxy.http.errors import ApiError, UnavailableError
from kdelay.proxy.sasl import Principal

log = logs.get(__name__)

#: Where the authentication middleware leaves a request's caller (``request.state``).
STATE_CALLER: Final = "kdelay_caller"
#: Set (True) on ``app.state`` when the API authenticates its callers.
STATE_AUTHENTICATES: Final = "kdelay_authenticates"


class UnauthenticatedError(ApiError):
    """The request carries no valid credentials (401, with ``WWW-Authenticate``)."""

    status = 401


class Caller(Protocol):
    """The principal a request acts for, and what Kafka allows it (module docstring)."""

    @property
    def principal(self) -> str | None:
        """``"User:alice"``; None when the API is open (``http_auth = "none"``)."""
        ...

    async def writable(self, topic: str) -> bool:
        """Kafka allows the caller WRITE on ``topic``."""
        ...

    async def admin(self) -> bool:
        """The caller is a kdelay administrator (ALTER on the buffer topic)."""
        ...


@dataclass(frozen=True, slots=True)
class OpenCaller:
    """The caller of an open API (``http_auth = "none"``): anyone, allowed everything."""

    principal: str | None = None

    async def writable(self, topic: str) -> bool:
        return True

    async def admin(self) -> bool:
        return True


OPEN: Final = OpenCaller()


class KafkaCaller:
    """A caller Kafka authenticated: what it may do is asked on its own login's connection."""

    def __init__(
        self,
        principal: Principal,
        access: TopicAccess,
        buffer_topic: str,
        lost: Callable[[], None],
    ) -> None:
        self._principal = principal
        self.access = access
        self.buffer_topic = buffer_topic
        self._lost = lost
        #: Requests using this login now; its connection closes only once it is retired (out
        #: of the cache) and unused, so no request loses it half-way.
        self.users = 0
        self.retired = False
        self.closed = False

    def acquire(self) -> bool:
        """Count a request using this login; False when its connection is already closed."""
        if self.closed:
            return False
        self.users += 1
        return True

    @property
    def link(self) -> Link:
        return self.access.link

    @property
    def principal(self) -> str:
        return str(self._principal)

    async def writable(self, topic: str) -> bool:
        try:
            refused = await self.access.unwritable([topic])
        except LinkError as exc:
            raise self._unavailable(exc) from None
        return topic not in refused

    async def admin(self) -> bool:
        try:
            return await self.access.admin(self.buffer_topic)
        except LinkError as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: LinkError) -> UnavailableError:
        self._lost()
        log.warning("proxy.http_auth_link_lost", principal=self.principal, error=str(exc))
        return UnavailableError(
            f"upstream Kafka cannot be asked what {self.principal} may do: {exc}"
        )


def current_caller(request: Request) -> Caller:
    """The caller of ``request`` (a FastAPI dependency): the one the authentication middleware
    established, or the open caller when the API authenticates nobody. A request the
    middleware let through without a caller on an authenticating API is refused (401): an open
    path (``/healthz``) never acts for anyone."""
    caller: Caller | None = getattr(request.state, STATE_CALLER, None)
    if caller is not None:
        return caller
    if getattr(request.app.state, STATE_AUTHENTICATES, False):
        raise UnauthenticatedError("this request carries no credentials")
    return OPEN
