"""The gate in front of a SASL listener's connections that have not logged in yet.

Nothing is free before login (DESIGN.md, v4): a peer without credentials must not be able to
hold what authenticated clients need. When the Kafka listener requires SASL, every accepted
connection asks this gate for a place before it is served, and gives it back once it is
authenticated or closed:

- at most ``prelogin_max_connections`` connections are not logged in at once, and at most
  ``prelogin_max_connections_per_address`` of them come from one client address; a connection
  over either cap is closed at once (the proxy logs the setting that refused it);
- the rest of what bounds an unauthenticated connection is applied where the connection is
  read (proxy/kafka/connection.py, proxy/kafka/auth_session.py): its frames are at most
  ``sasl_max_receive_bytes`` and take nothing from ``max_buffered_request_bytes`` (so memory
  before login is at most the cap on connections times a few such frames), and it is closed
  ``sasl_authentication_timeout_ms`` after it was accepted; on a TLS listener that deadline
  also bounds the TLS handshake (proxy/kafka/server.py).

Concurrency: used from the asyncio loop thread only; nothing here is thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PreloginGate", "Refused", "Ticket"]


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a connection was not let in: the setting whose cap it hit, and the cap."""

    setting: str
    limit: int


class Ticket:
    """One admitted connection's place; ``release`` is idempotent."""

    __slots__ = ("_address", "_gate")

    def __init__(self, gate: PreloginGate, address: str) -> None:
        self._gate: PreloginGate | None = gate
        self._address = address

    @property
    def held(self) -> bool:
        return self._gate is not None

    def release(self) -> None:
        """The connection logged in or closed: its place is free."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._leave(self._address)  # the gate's own ticket


class PreloginGate:
    """Counts connections not yet logged in, in total and per address (module docstring)."""

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        if max_connections < 1:
            raise ValueError(f"prelogin_max_connections must be at least 1, got {max_connections}")
        if max_per_address < 1:
            raise ValueError(
                f"prelogin_max_connections_per_address must be at least 1, got {max_per_address}"
            )
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        #: Connections admitted and not yet logged in or closed.
        self.open = 0
        #: Connections refused so far.
        self.refused = 0
        self._by_address: dict[str, int] = {}

    def admit(self, address: str) -> Ticket | Refused:
        """A place for a new connection from ``address``, or why there is none."""
        if self.open >= self.max_connections:
            self.refused += 1
            return Refused("prelogin_max_connections", self.max_connections)
        count = self._by_address.get(address, 0)
        if count >= self.max_per_address:
            self.refused += 1
            return Refused("prelogin_max_connections_per_address", self.max_per_address)
        self._by_address[address] = count + 1
        self.open += 1
        return Ticket(self, address)

    def from_address(self, address: str) -> int:
        """Connections from ``address`` holding a place now."""
        return self._by_address.get(address, 0)

    def addresses(self) -> int:
        """Addresses with connections holding a place now: an address whose connections all
        left is not remembered."""
        return len(self._by_address)

    def _leave(self, address: str) -> None:
        self.open -= 1
        left = self._by_address[address] - 1
        if left:
            self._by_address[address] = left
        else:
            del self._by_address[address]  # no entry per address once it has gone
