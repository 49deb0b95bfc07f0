"""The Kafka listener: an asyncio server speaking the Kafka protocol to producers.

Concurrency and ordering contract
---------------------------------
- Start-up: ``bind`` takes the listening address without accepting connections, so the
  ``Broker`` can be built knowing the address it advertises; ``serve`` then accepts with it.
- Everything here runs on one asyncio event loop thread. librdkafka's delivery callbacks run on
  the upstream poll thread and reach the loop only through ``call_soon_threadsafe``
  (proxy/upstream.py); blocking metadata lookups run in worker threads (``asyncio.to_thread``).
- Per connection there are two tasks. The *reader* reads one frame at a time, decodes it and
  awaits stage 1 of its handler (``Broker.handle``: validation, sequence checks, handing the
  records to librdkafka) before reading the next frame, so records reach upstream in the order
  the client sent them. It then queues the request's stage 2 (the wait for upstream acks) for
  the *writer*, which awaits the queued replies strictly in queue order and writes them: a
  connection's responses leave in request order, as Kafka requires, while up to
  ``max_inflight_per_connection`` requests wait on upstream concurrently.
- Backpressure: the reader takes an in-flight permit before reading a frame and the writer gives
  it back after the response is written, so a connection with that many requests unanswered is
  not read from (the kernel's socket buffers, then the client's own writes, fill up instead).
  When librdkafka's queue is full, stage 1 waits, which also stops the reader.
- Memory: after a frame's 4-byte size prefix, and before its body is read, the reader reserves
  that many bytes from the process-wide ``RequestBudget`` (``max_buffered_request_bytes``,
  proxy/budget.py, shared with the HTTP API) and waits, reading nothing more, until they fit;
  the writer gives them back once the response is written (what is left when the connection
  ends is given back then). So many connections each sending a huge frame slowly hold at most
  the budget (plus about one stream-buffer limit each) instead of every partial frame.
- Idle timeout: a connection that sends nothing for ``idle_timeout_s`` while owed no response
  is closed. One waiting for its responses (upstream slow) is not idle.
- A malformed frame, an oversized length prefix, an unsupported API or an idle timeout closes
  that connection only (with a structured log line), after the responses already owed to it are
  written. Every other connection is untouched: nothing a connection does raises out of its own
  tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from kdelay import logs
from proxy import protocol as p
from proxy.broker import Broker, Reply, resolved
from proxy.budget import RequestBudget
from proxy.metrics import ProxyMetrics

log = logs.get(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits."""

    max_request_bytes: int = 100 * 1024 * 1024
    max_inflight: int = 5
    idle_timeout_s: float = 600.0


#: The default of max_buffered_request_bytes (proxy/config.py).
DEFAULT_BUFFERED_REQUEST_BYTES = 256 * 1024 * 1024


@dataclass(slots=True)
class _Pending:
    request: p.Request | None
    started: float
    reply: Awaitable[Reply]
    #: Bytes of the budget this request holds until it is answered.
    reserved: int = 0


class _Close(Exception):  # noqa: N818 - control flow, not an error users see
    """Stop reading this connection; ``event`` and fields go to the log."""

    def __init__(self, event: str, **fields: object) -> None:
        super().__init__(event)
        self.event = event
        self.fields = fields


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
    ) -> None:
        self.metrics = metrics
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
        self._connections.add(task)
        try:
            await Connection(self, self._broker, reader, writer).serve()
        except asyncio.CancelledError:
            # Shutdown. Ending normally keeps asyncio's stream callback from logging it.
            pass
        finally:
            self._connections.discard(task)


class Connection:
    """One client connection (see the module docstring for the contract)."""

    def __init__(
        self,
        server: KafkaServer,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.server = server
        self.broker = broker
        self.metrics = server.metrics
        self.limits = server.limits
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.permits = asyncio.Semaphore(self.limits.max_inflight)
        self.budget = server.budget
        #: Budget bytes this connection holds (its unanswered requests, a frame being read).
        self.reserved = 0
        #: Requests read and not yet answered (or dropped).
        self.inflight = 0
        self.queue: asyncio.Queue[_Pending | None] = asyncio.Queue()

    async def serve(self) -> None:
        self.metrics.connections.inc()
        writer_task = asyncio.create_task(self._write_loop())
        try:
            await self._read_loop()
        except asyncio.CancelledError:
            # Shutdown: replies still awaited upstream are not waited for.
            writer_task.cancel()
            raise
        except _Close as stop:
            log.warning(stop.event, peer=self.peer, **stop.fields)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            # A bug in a handler must cost this connection only, never the listener.
            log.exception("proxy.connection_failed", peer=self.peer)
        finally:
            self.queue.put_nowait(None)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer_task
            self._release(self.reserved)  # requests never answered (shutdown, broken handler)
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.metrics.connections.dec()

    async def _reserve(self, size: int) -> None:
        """Take ``size`` bytes of the process-wide budget, waiting (unread) until they fit."""
        if not self.budget.try_acquire(size):
            log.info("proxy.request_memory_wait", peer=self.peer, size=size)
            await self.budget.acquire(size)
        self.reserved += size

    def _release(self, size: int) -> None:
        if size:
            self.reserved -= size
            self.budget.release(size)

    async def _read_frame(self) -> bytes | None:
        """The next request frame, or None at a clean end of stream."""
        idle = self.limits.idle_timeout_s
        while True:
            try:
                # Cancelling readexactly on a timeout loses nothing: it consumes only once all
                # n bytes are buffered. asyncio.timeout, not wait_for: in Python 3.11 wait_for
                # can swallow a cancellation (shutdown) when the read completes at that moment.
                async with asyncio.timeout(idle):
                    prefix = await self.reader.readexactly(4)
                break
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise _Close("truncated_frame", got=len(exc.partial), expected=4) from None
                return None
            except TimeoutError:
                if self.inflight == 0:
                    raise _Close("idle_timeout", seconds=idle) from None
        size = p.frame_size(prefix)
        if size > self.limits.max_request_bytes:
            raise _Close("request_too_large", size=size, limit=self.limits.max_request_bytes)
        if size < 8:
            raise _Close("malformed_frame", reason=f"frame size {size} is below a header's")
        await self._reserve(size)  # released once answered (the writer), or below on failure
        try:
            async with asyncio.timeout(idle):
                frame = await self.reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            self._release(size)
            raise _Close("truncated_frame", got=len(exc.partial), expected=size) from None
        except TimeoutError:
            self._release(size)
            raise _Close("idle_timeout", seconds=idle, reason="mid-frame") from None
        self.metrics.bytes_in.inc(size + 4)
        return frame

    async def _read_loop(self) -> None:
        while True:
            await self.permits.acquire()
            frame = await self._read_frame()
            if frame is None:
                return
            self.inflight += 1
            started = time.perf_counter()
            try:
                request = p.decode_request(frame)
            except p.UnsupportedApiError as exc:
                name = p.API_NAMES.get(exc.api_key, str(exc.api_key))
                self.metrics.requests.labels(
                    name, str(exc.api_version), "UNSUPPORTED_VERSION"
                ).inc()
                if exc.api_key == p.API_VERSIONS:
                    # KIP-511: answer in v0 so the client can retry with a version we list.
                    frame_out = p.unsupported_api_versions_frame(exc.correlation_id)
                    await self._enqueue(None, started, Reply(frame=frame_out), len(frame))
                    continue
                raise _Close(
                    "unsupported_api", api_key=exc.api_key, version=exc.api_version
                ) from None
            except p.ProtocolError as exc:
                raise _Close("malformed_request", error=str(exc)) from None
            reply = await self.broker.handle(request)
            self.queue.put_nowait(_Pending(request, started, reply, len(frame)))

    async def _enqueue(
        self, request: p.Request | None, started: float, reply: Reply, reserved: int
    ) -> None:
        self.queue.put_nowait(_Pending(request, started, resolved(reply), reserved))

    async def _write_loop(self) -> None:
        """Write replies in request order; after a write error, only drain the queue."""
        broken = False
        while True:
            item = await self.queue.get()
            if item is None:
                return
            try:
                broken = await self._answer(item, broken)
            finally:
                self.inflight -= 1
                self.permits.release()
                self._release(item.reserved)

    async def _answer(self, item: _Pending, broken: bool) -> bool:
        """Await one reply and write it (unless ``broken``); whether the connection is broken."""
        try:
            reply = await item.reply
        except Exception:
            # A handler bug: this connection cannot answer in order any more; close it.
            log.exception("proxy.reply_failed", peer=self.peer)
            self.writer.close()
            return True
        req = item.request
        if req is not None:
            self.metrics.requests.labels(
                p.API_NAMES[req.api_key], str(req.api_version), reply.result
            ).inc()
        if broken:
            return True
        data = reply.frame
        if data is None and reply.response is not None and req is not None:
            try:
                data = p.encode_response(req, reply.response)
            except Exception:
                log.exception("proxy.encode_failed", peer=self.peer, api=req.api_key)
                self.writer.close()
                return True
        if data is None:
            return False
        try:
            self.writer.write(data)
            await self.writer.drain()
            self.metrics.bytes_out.inc(len(data))
        except ConnectionError:
            return True
        return False
