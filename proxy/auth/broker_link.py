"""A connection of the proxy's own to an upstream broker, authenticated as one client.

Kroxylicious's way of keeping Kafka the source of truth: for each client connection that logs in
over SASL, the proxy opens one connection to a broker's SASL listener, relays the client's
SaslHandshake and SaslAuthenticate requests over it (so Kafka checks the credentials), and then
asks Kafka on it what that principal may do (Metadata with authorized operations, KIP-430).
The broker sees the proxy's address, so ACLs that name client hosts cannot apply to it.

``LinkSettings.from_upstream`` derives where and how to connect from the proxy's own upstream
settings (``ProxyConfig.upstream_client_config()``: the ``kafka_*`` settings merged with
``upstream_config``): the bootstrap servers, and TLS when their ``security.protocol`` is
SASL_SSL, with its ``ssl.ca.location``, client certificate (``ssl.certificate.location``,
``ssl.key.location``, ``ssl.key.password``) and ``ssl.endpoint.identification.algorithm``
(``none`` turns host name checks off, as in librdkafka). The SASL user of the upstream config is
never used here.

Concurrency: a link belongs to one client connection and is used from the asyncio loop only;
``request`` holds a lock, so its requests go one at a time (the connection's reader awaits each
anyway). Any failure (connect, TLS, timeout, a closed or garbled stream) raises LinkError and
leaves the link closed: the caller closes its client connection, and the client reconnects and
logs in again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Protocol

from kdelay.errors import KdelayError
from kdelay.proxy.wire import protocol as p

#: A response larger than this from the broker is refused (Metadata of many topics fits).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: The client id the broker sees on links (its logs and quotas name it).
CLIENT_ID = "kdelay-proxy-auth"


class LinkError(KdelayError):
    """The link to the broker failed; it is closed."""


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """Where links connect and how."""

    addresses: tuple[tuple[str, int], ...]
    tls: ssl.SSLContext | None = None
    timeout_s: float = 10.0

    @classmethod
    def from_upstream(
        cls, bootstrap_servers: str, upstream_config: dict[str, str], timeout_s: float = 10.0
    ) -> LinkSettings:
        """Links to ``bootstrap_servers`` with the TLS settings of the proxy's upstream
        (librdkafka's names, see the module docstring); raises ValueError naming a bad one."""
        addresses = tuple(_address(a) for a in bootstrap_servers.split(",") if a.strip())
        if not addresses:
            raise ValueError("bootstrap_servers names no broker")
        protocol = upstream_config.get("security.protocol", "PLAINTEXT").upper()
        tls = _tls_context(upstream_config) if protocol in ("SSL", "SASL_SSL") else None
        return cls(addresses, tls, timeout_s)


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bootstrap server {text.strip()!r} is not host:port")
    return host.strip("[]"), int(port)


def _tls_context(conf: dict[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=conf.get("ssl.ca.location"))
    if conf.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
        ctx.check_hostname = False
    if conf.get("enable.ssl.certificate.verification", "true").lower() == "false":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert = conf.get("ssl.certificate.location")
    if cert:
        ctx.load_cert_chain(
            cert, conf.get("ssl.key.location"), password=conf.get("ssl.key.password")
        )
    return ctx


class Link(Protocol):
    """What sessions and authorization use of a link (a fake in unit tests)."""

    @property
    def open(self) -> bool: ...

    async def connect(self) -> None: ...

    async def request(self, request: Any) -> Any: ...

    async def close(self) -> None: ...


class BrokerLink:
    """One connection to a broker: framed requests out, their responses back, in order."""

    def __init__(self, settings: LinkSettings) -> None:
        self.settings = settings
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._correlation = 0
        #: The broker this link reached, host:port.
        self.broker = ""

    @property
    def open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self) -> None:
        """Connect to the first bootstrap broker that answers (in random order)."""
        addresses = list(self.settings.addresses)
        random.shuffle(addresses)
        failures = []
        for host, port in addresses:
            try:
                async with asyncio.timeout(self.settings.timeout_s):
                    self._reader, self._writer = await asyncio.open_connection(
                        host,
                        port,
                        ssl=self.settings.tls,
                        server_hostname=host if self.settings.tls else None,
                        limit=2**20,
                    )
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                failures.append(f"{host}:{port}: {exc or type(exc).__name__}")
                continue
            self.broker = f"{host}:{port}"
            return
        raise LinkError("no upstream broker accepted a connection: " + "; ".join(failures))

    async def request(self, request: Any) -> Any:
        """Send ``request`` (a kafka-python request object) and return its decoded response;
        raises LinkError (and closes the link) on any failure."""
        async with self._lock:
            reader, writer = self._reader, self._writer
            if reader is None or writer is None or writer.is_closing():
                raise LinkError("the link to the broker is closed")
            self._correlation += 1
            correlation = self._correlation
            request.with_header(correlation_id=correlation, client_id=CLIENT_ID)
            try:
                async with asyncio.timeout(self.settings.timeout_s):
                    writer.write(bytes(request.encode(header=True, framed=True)))
                    await writer.drain()
                    frame = await _read_frame(reader)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
                await self.close()
                what = "timed out" if isinstance(exc, TimeoutError) else "failed"
                raise LinkError(f"request to broker {self.broker} {what}: {exc!r}") from None
            except LinkError:
                await self.close()
                raise
            spec = p.SASL_APIS.get(request.API_KEY) or p.APIS[request.API_KEY]
            try:
                response = spec.response.decode(frame, version=request.API_VERSION, header=True)
            except p.DECODE_ERRORS as exc:
                await self.close()
                raise LinkError(
                    f"undecodable response from broker {self.broker}: {exc!r}"
                ) from None
            if response.header.correlation_id != correlation:
                await self.close()
                raise LinkError(f"broker {self.broker} answered out of order")
            return response

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 < size <= MAX_RESPONSE_BYTES:
        raise LinkError(f"the broker sent a response of {size} bytes")
    return await reader.readexactly(size)
