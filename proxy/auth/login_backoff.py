"""How long the proxy waits before answering a failed login, per client address.

Kafka waits ``connection.failed.authentication.delay.ms`` (100 ms by default, KIP-306) before it
answers a failed authentication and closes the connection, which slows a password-guessing
client down. The proxy does the same and doubles the wait with each further failure from the
same address (up to ``max_delay_s``), so a flood of failed logins from one address gets slower
and slower answers while every other client is served as before: the wait delays only the
failed connection's own answer (the event loop is never blocked). An address's count starts
again after ``quiet_s`` without failures. At most ``max_addresses`` are remembered; the least
recently failed are forgotten first.

Used from the asyncio loop thread only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class LoginBackoff:
    """Per-address failed-login counts and the wait they earn."""

    def __init__(
        self,
        base_delay_s: float = 0.1,
        max_delay_s: float = 5.0,
        *,
        quiet_s: float = 60.0,
        max_addresses: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay_s = base_delay_s
        self.max_delay_s = max(max_delay_s, base_delay_s)
        self.quiet_s = quiet_s
        self.max_addresses = max_addresses
        self.clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def failed(self, address: str) -> float:
        """Record a failed login from ``address``; the seconds to wait before answering it."""
        now = self.clock()
        count, last = self._failures.pop(address, (0, now))
        if now - last > self.quiet_s:
            count = 0
        count += 1
        self._failures[address] = (count, now)
        while len(self._failures) > self.max_addresses:
            self._failures.popitem(last=False)
        if self.base_delay_s <= 0:
            return 0.0
        return float(min(self.max_delay_s, self.base_delay_s * 2.0 ** min(count - 1, 30)))

    def failures(self, address: str) -> int:
        """Recent failures from ``address`` (0 once it has been quiet for ``quiet_s``)."""
        found = self._failures.get(address)
        if found is None or self.clock() - found[1] > self.quiet_s:
            return 0
        return found[0]
