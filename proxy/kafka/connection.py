"""One client connection of the Kafka listener (proxy/kafka/server.py accepts them).

Concurrency and ordering contract
---------------------------------
- Everything here runs on one asyncio event loop thread. librdkafka's delivery callbacks run on
  the upstream poll thread and reach the loop only through ``call_soon_threadsafe``
  (proxy/upstream/producer.py); blocking metadata lookups run in worker threads
  (``asyncio.to_thread``).
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
  the budget (plus about one stream-buffer limit each) instead of every partial frame. A frame
  read before the connection is authenticated reserves nothing: it is at most
  ``sasl_max_receive_bytes``, and the pre-login gate (proxy/auth/prelogin.py) bounds how many such
  connections there are, so a peer without credentials holds no share of the budget however
  large a frame it announces.
- Idle timeout: a connection that sends nothing for ``idle_timeout_s`` while owed no response
  is closed. One waiting for its responses (upstream slow) is not idle.
- A malformed frame, an oversized length prefix, an unsupported API or an idle timeout closes
  that connection only (with a structured log line), after the responses already owed to it are
  written. Every other connection is untouched: nothing a connection does raises out of its own
  tasks.
- SASL (``auth``, proxy/kafka/auth_session.py): each connection's ``AuthSession`` sees every decoded
  request before the broker; it answers the SASL APIs (in stage 1: the reader awaits the relay
  to upstream Kafka, as the client awaits its answer) and refuses what Kafka refuses before
  authentication. Until the connection is authenticated a frame may be at most
  ``sasl_max_receive_bytes``, and the connection closes ``sasl_authentication_timeout_ms`` after
  it was accepted; until then it holds a ``Ticket`` of the pre-login gate, released once it is
  authenticated (or closed). A failed login's answer is delayed in stage 2 (a task), so the
  wait holds no other connection up. When the session's link to upstream Kafka fails
  (authorization cannot be asked), the connection closes; the client reconnects and logs in
  again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from kdelay import logs
from kdelay.errors import KdelayError
from kdelay.proxy import metric_labels
from kdelay.proxy.auth.broker_link import LinkError
from kdelay.proxy.auth.prelogin import Ticket
from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.kafka.auth_session import AuthSession, Phase
from kdelay.proxy.kafka.auth_settings import AuthSettings
from kdelay.proxy.kafka.broker import Broker, Reply, resolved
from kdelay.proxy.kafka.sasl_answers import (
    bare_token_reply,
    bare_token_request,
    bare_tokens_follow,
    sasl_disabled,
)
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.wire import protocol as p

log = logs.get(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits."""

    max_request_bytes: int = 100 * 1024 * 1024
    max_inflight: int = 5
    idle_timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Shared:
    """What every connection of one listener shares."""

    metrics: ProxyMetrics
    limits: Limits
    budget: RequestBudget
    #: SASL on the listener (proxy/kafka/auth_session.py), or None.
    auth: AuthSettings | None = None


@dataclass(slots=True)
class _Pending:
    request: p.Request | None
    started: float
    reply: Awaitable[Reply]
    #: Bytes of the budget this request holds until it is answered.
    reserved: int = 0


class _Close(KdelayError):  # noqa: N818 - control flow, not an error users see
    """Stop reading this connection; ``event`` and fields go to the log."""

    def __init__(self, event: str, **fields: object) -> None:
        super().__init__(event)
        self.event = event
        self.fields = fields


class Connection:
    """One client connection (see the module docstring for the contract)."""

    def __init__(
        self,
        context: Shared,
        broker: Broker,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        ticket: Ticket | None = None,
    ) -> None:
        self.broker = broker
        #: Its place among the connections not yet logged in (proxy/auth/prelogin.py), or None.
        self.ticket = ticket
        self.metrics = context.metrics
        self.limits = context.limits
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self.session: AuthSession | None = AuthSession(context.auth, host) if context.auth else None
        #: After a SaslHandshake v0 the SASL tokens come bare (proxy/kafka/sasl_answers.py).
        self.bare_tokens = False
        self.permits = asyncio.Semaphore(self.limits.max_inflight)
        self.budget = context.budget
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
            if self.ticket is not None:
                self.ticket.release()
            if self.session is not None:
                with contextlib.suppress(Exception):
                    await self.session.close()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
            self.metrics.connections.dec()

    async def _reserve(self, size: int) -> None:
        """Take ``size`` bytes of the process-wide budget, waiting (unread) until they fit."""
        if size and not self.budget.try_acquire(size):
            log.info("proxy.request_memory_wait", peer=self.peer, size=size)
            await self.budget.acquire(size)
        self.reserved += size

    def _release(self, size: int) -> None:
        if size:
            self.reserved -= size
            self.budget.release(size)

    def _timeout(self) -> float:
        """How long a read may wait: the idle timeout, or less until the login deadline."""
        idle = self.limits.idle_timeout_s
        session = self.session
        if session is None or session.authenticated:
            return idle
        left = session.auth_deadline - session.settings.clock()
        if left <= 0:
            session.failed("timeout")
            raise _Close("proxy.sasl_authentication_timeout", seconds=session.settings.timeout_s)
        return min(idle, left)

    def _limit(self) -> int:
        limit = self.limits.max_request_bytes
        return limit if self.session is None else self.session.frame_limit(limit)

    async def _read_frame(self) -> tuple[bytes, int] | None:
        """The next request frame and the budget bytes it holds, or None at a clean end of
        stream."""
        idle = self.limits.idle_timeout_s
        while True:
            try:
                # Cancelling readexactly on a timeout loses nothing: it consumes only once all
                # n bytes are buffered. asyncio.timeout, not wait_for: in Python 3.11 wait_for
                # can swallow a cancellation (shutdown) when the read completes at that moment.
                async with asyncio.timeout(self._timeout()):
                    prefix = await self.reader.readexactly(4)
                break
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise _Close("truncated_frame", got=len(exc.partial), expected=4) from None
                return None
            except TimeoutError:
                if self.inflight == 0 and self._timeout() >= idle:
                    raise _Close("idle_timeout", seconds=idle) from None
        size = p.frame_size(prefix)
        limit = self._limit()
        if size > limit:
            setting = "max_request_bytes"
            if limit < self.limits.max_request_bytes and self.session is not None:
                self.session.failed("malformed")
                setting = "sasl_max_receive_bytes"  # before authentication
            raise _Close("request_too_large", size=size, limit=limit, setting=setting)
        if size < 8 and not self.bare_tokens:
            raise _Close("malformed_frame", reason=f"frame size {size} is below a header's")
        # Before login nothing is reserved (the module docstring): released once answered
        # (the writer), or below on failure.
        reserve = size if self.session is None or self.session.authenticated else 0
        await self._reserve(reserve)
        try:
            async with asyncio.timeout(self._timeout()):
                frame = await self.reader.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            self._release(reserve)
            raise _Close("truncated_frame", got=len(exc.partial), expected=size) from None
        except (TimeoutError, _Close) as exc:
            self._release(reserve)
            if isinstance(exc, _Close):
                raise
            self._timeout()  # raises when the login deadline passed
            raise _Close("idle_timeout", seconds=idle, reason="mid-frame") from None
        self.metrics.bytes_in.inc(size + 4)
        return frame, reserve

    async def _read_loop(self) -> None:
        while True:
            await self.permits.acquire()
            read = await self._read_frame()
            if read is None:
                return
            frame, reserved = read
            self.inflight += 1
            started = time.perf_counter()
            try:
                request = bare_token_request(frame) if self.bare_tokens else p.decode_request(frame)
            except p.UnsupportedApiError as exc:
                self.metrics.requests.labels(
                    metric_labels.api(exc.api_key),
                    metric_labels.api_version(exc.api_key, exc.api_version),
                    "UNSUPPORTED_VERSION",
                ).inc()
                if exc.api_key == p.API_VERSIONS:
                    # KIP-511: answer in v0 so the client can retry with a version we list.
                    frame_out = p.unsupported_api_versions_frame(
                        exc.correlation_id, sasl=self.session is not None
                    )
                    await self._enqueue(None, started, Reply(frame=frame_out), reserved)
                    continue
                self._unauthenticated_failure()
                raise _Close(
                    "unsupported_api", api_key=exc.api_key, version=exc.api_version
                ) from None
            except p.ProtocolError as exc:
                self._unauthenticated_failure()
                raise _Close("malformed_request", error=str(exc)) from None
            try:
                if await self._screened(request, started, reserved):
                    continue
                access = self.session.access if self.session is not None else None
                reply = await self.broker.handle(request, access)
            except LinkError as exc:
                # Kafka cannot be asked what the principal may do: the client logs in anew.
                raise _Close("proxy.sasl_upstream_unavailable", error=str(exc)) from None
            self.queue.put_nowait(_Pending(request, started, reply, reserved))

    async def _screened(self, request: p.Request, started: float, size: int) -> bool:
        """Whether SASL took ``request`` (answered, refused or closing; see the module
        docstring); False passes it on to the broker."""
        if self.session is None:
            if request.api_key in p.SASL_APIS:  # this listener speaks no SASL
                await self._enqueue(request, started, sasl_disabled(request), size)
                return True
            return False
        screened = await self.session.screen(request)
        bare, exchanging = self.bare_tokens, self.session.phase is Phase.AUTHENTICATE
        self.bare_tokens = bare_tokens_follow(request, exchanging, bare)
        if self.ticket is not None and self.session.authenticated:
            self.ticket.release()  # logged in: no longer counted before login
        if screened is None:
            return False
        if screened.reply is not None:
            reply = (
                asyncio.ensure_future(bare_token_reply(screened.reply)) if bare else screened.reply
            )
            self.queue.put_nowait(_Pending(request, started, reply, size))
        if screened.close is not None:
            raise _Close(screened.close, **screened.fields)
        return True

    def _unauthenticated_failure(self) -> None:
        """A malformed or unsupported request before authentication counts as a failed login."""
        if self.session is not None and not self.session.authenticated:
            self.session.failed("malformed")

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
                metric_labels.api(req.api_key),
                metric_labels.api_version(req.api_key, req.api_version),
                metric_labels.result(reply.result),
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
