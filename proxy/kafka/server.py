"""The Kafka listener: an asyncio server speaking the Kafka protocol to producers.

``bind`` takes the listening address without accepting connections, so the ``Broker`` can be
built knowing the address it advertises; ``serve`` then accepts with it. Each accepted
connection is served by a ``proxy.kafka.connection.Connection`` (its concurrency, ordering, memory
and SASL contract is at the top of proxy/kafka/connection.py). Everything runs on one asyncio event
loop thread.

With SASL, a connection is served only if the pre-login gate (proxy/auth/prelogin.py) admits it;
one over ``prelogin_max_connections`` or ``prelogin_max_connections_per_address`` is closed at
once, with a log line naming the setting. On a TLS listener with SASL, the TLS handshake must
end within the login deadline (``sasl_authentication_timeout_ms``; asyncio's own is 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from pathlib import Path

from kdelay import logs
from kdelay.proxy.auth.prelogin import PreloginGate, Refused
from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.kafka.auth_settings import AuthSettings
from kdelay.proxy.kafka.broker import Broker
from kdelay.proxy.kafka.connection import Connection, Limits, Shared
from kdelay.proxy.metrics import ProxyMetrics

__all__ = [
    "DEFAULT_BUFFERED_REQUEST_BYTES",
    "KafkaServer",
    "Limits",
    "reuse_port_socket",
    "tls_context",
]

log = logs.get(__name__)


#: The default of max_buffered_request_bytes (proxy/config.py).
DEFAULT_BUFFERED_REQUEST_BYTES = 256 * 1024 * 1024


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The listener's TLS (``tls_cert``, ``tls_key``); None without both."""
    if cert is None or key is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port) with ``SO_REUSEPORT``, not listening:
    other processes bind the same port the same way (proxy/workers.py); raises OSError."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class KafkaServer:
    """Accepts client connections and serves each with a reader and a writer task."""

    def __init__(
        self,
        metrics: ProxyMetrics,
        limits: Limits | None = None,
        ssl_context: ssl.SSLContext | None = None,
        budget: RequestBudget | None = None,
        *,
        reuse_port: bool = False,
        auth: AuthSettings | None = None,
        prelogin: PreloginGate | None = None,
    ) -> None:
        self.metrics = metrics
        #: SASL on this listener (proxy/kafka/auth_session.py), or None.
        self.auth = auth
        #: Connections not yet logged in (proxy/auth/prelogin.py): with SASL only.
        self.prelogin = (prelogin or PreloginGate(1_024, 128)) if auth is not None else None
        self.reuse_port = reuse_port  # SO_REUSEPORT: other proxy processes share the port
        self.limits = limits or Limits()
        self.ssl_context = ssl_context
        self.budget = budget or RequestBudget(
            max(DEFAULT_BUFFERED_REQUEST_BYTES, self.limits.max_request_bytes), metrics
        )
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._broker: Broker | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def bind(self, host: str, port: int) -> tuple[str, int]:
        """Take host:port (0: a free port) without accepting yet; returns the bound address."""
        self._server = await asyncio.start_server(
            self._on_connect,
            host,
            port,
            ssl=self.ssl_context,
            ssl_handshake_timeout=(
                self.auth.timeout_s if self.auth is not None and self.ssl_context else None
            ),
            limit=2**20,
            start_serving=False,
            reuse_port=self.reuse_port,
        )
        sock = self._server.sockets[0].getsockname()
        self._address = str(sock[0]), int(sock[1])
        return self._address

    async def serve(self, broker: Broker) -> None:
        """Accept connections on the bound address and answer their requests with ``broker``."""
        assert self._server is not None, "bind() first"
        self._broker = broker
        await self._server.start_serving()

    @property
    def listener(self) -> asyncio.Server | None:
        """The bound listening server (None before :meth:`bind`)."""
        return self._server

    @property
    def serving(self) -> bool:
        """Whether connections are being accepted."""
        return self._server is not None and self._server.is_serving()

    async def resume(self) -> None:
        """Accept connections again after the listener stopped (supervision): on the same
        server when its socket is still open, else on a new one bound to the same address."""
        assert self._broker is not None, "serve() first"
        assert self._address is not None, "bind() first"
        if self._server is None or not self._server.sockets:
            await self.bind(*self._address)
        await self.serve(self._broker)

    async def close(self) -> None:
        """Stop accepting and close every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        # Connections are accepted only once serve() has the broker.
        assert self._broker is not None
        ticket = None
        if self.prelogin is not None:
            peer = writer.get_extra_info("peername")
            host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
            admitted = self.prelogin.admit(host)
            if isinstance(admitted, Refused):
                log.warning(
                    "proxy.prelogin_refused",
                    peer=host,
                    setting=admitted.setting,
                    limit=admitted.limit,
                )
                writer.close()
                return
            ticket = admitted
        self._connections.add(task)
        try:
            shared = Shared(self.metrics, self.limits, self.budget, self.auth)
            await Connection(shared, self._broker, reader, writer, ticket).serve()
        except asyncio.CancelledError:
            # Shutdown. Ending normally keeps asyncio's stream callback from logging it.
            pass
        finally:
            if ticket is not None:
                ticket.release()
            self._connections.discard(task)
