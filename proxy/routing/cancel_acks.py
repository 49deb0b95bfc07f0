"""When the proxy may acknowledge a cancel (or a replace, which is also a cancel of its id).

The rule (``kdelay.buffer.cancels``, README "Cancelling a message"): a cancel cancels a message
with its id appended after it when a proxy accepted that message no later than
``CANCEL_SENT_WITH_MS`` after the cancel's append time, both on the broker's clock (the
message's acceptance stamp is the broker clock's upper bound, proxy/routing/buffer_keys.py). So a
cancel is acknowledged only once the broker's clock has surely passed its append time plus
``CANCEL_SENT_WITH_MS``: a message sent after that acknowledgement, through any proxy, is
accepted later still, and is never cancelled by it, while a message sent with it (in flight
beside it, even in another request) is. The hold costs a cancel's answer about
``CANCEL_SENT_WITH_MS`` plus the broker-clock probe's round trip; records without a cancel are
never held.

Also the order of a Produce request's cancels (proxy/kafka/broker.py): :func:`submit_cancels` hands
them upstream after the request's other records, :func:`after_cancels` answers a partition once
its cancels are acknowledged too.

Any thread or task may call :meth:`CancelAcks.hold` (it only reads the clock); the functions
run on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol

from kdelay.buffer import CANCEL_SENT_WITH_MS
from kdelay.proxy.routing.route import Outgoing, UpstreamPort

#: One partition's cancels, and where their acknowledgement goes once submitted.
Cancels = tuple[list[Outgoing], "asyncio.Future[Awaitable[int]]"]


async def submit_cancels(upstream: UpstreamPort, cancels: list[Cancels]) -> None:
    """Hand a request's cancels upstream, after its other records; each partition's slot gets
    its acknowledgement (or the error that kept them from upstream)."""
    for records, slot in cancels:
        try:
            slot.set_result(await upstream.submit(records))
        except BaseException as exc:
            slot.set_exception(exc)
            if not isinstance(exc, Exception):
                raise


async def after_cancels(first: Awaitable[int], slot: asyncio.Future[Awaitable[int]]) -> int:
    """A partition's base offset (``first``'s), once its cancels are acknowledged too."""
    base = await first
    await (await slot)
    return base


class BrokerTime(Protocol):
    """The bounds of the broker's clock (:class:`kdelay.broker_clock.BrokerClock`)."""

    def now_ms(self) -> int | None: ...

    def upper_ms(self) -> int | None: ...


class CancelAcks:
    """Holds a cancel's acknowledgement until the cancel can no longer cancel what comes next."""

    def __init__(self, clock: BrokerTime, *, poll_s: float = 0.005) -> None:
        self._clock = clock
        self._poll_s = poll_s

    def known(self) -> bool:
        """Whether the broker's clock is known: a cancel written now can be acknowledged (until
        the first probe answers, :meth:`hold` would wait for it, however long that takes)."""
        return self._clock.upper_ms() is not None

    async def hold(self) -> None:
        """Call once the cancel was acknowledged upstream (its append time is now at most the
        clock's upper bound): returns once the lower bound is past that plus the window."""
        upper = self._clock.upper_ms()
        while upper is None:
            await asyncio.sleep(self._poll_s * 20)
            upper = self._clock.upper_ms()
        until = upper + CANCEL_SENT_WITH_MS
        while (self._clock.now_ms() or 0) <= until:  # noqa: ASYNC110 - a clock, not an event
            await asyncio.sleep(self._poll_s)

    async def held(self, acked: Awaitable[int]) -> int:
        """``acked``'s offset, once the cancels it carries may be acknowledged."""
        base = await acked
        await self.hold()
        return base
