"""The replica's HTTP port: ``/metrics`` (prometheus_client, unchanged), ``/healthz``,
``/readyz``, and the message queries ``/v1/messages/<id>``, ``/v1/messages`` (the listing) and
``/v1/pending`` (queries.py).

:class:`Health` holds what the two checks read.

``/healthz`` (liveness): the process is doing its job, i.e. the control loop turns and no
supervised thread is gone for good. ``/readyz`` (readiness): caught up with the buffer topic,
ingest making progress, no component waiting out a failure backoff. Both answer JSON
``{"status": "ok"|"fail", "reason": "..."}`` with 200 or 503; every other path is
prometheus_client's own WSGI app, exactly as ``start_http_server`` serves it.

``GET /v1/messages/<id>`` (the id percent-encoded, ``/`` as ``%2F``), ``GET
/v1/pending?bucket=1m&horizon=24h``, the listing ``GET /v1/messages?state=pending&...`` and
``GET /v1/bulk-cancels/<id>`` (what a bulk cancel did here: its count, bulk_cancels.py)
answer JSON from this replica's store with the freshness of
the answer (queries.py; docs/status.md), errors in the proxy's one shape ``{"error", "field"}``:
400 a bad id or parameter, 404 an unknown id, 405 another method, 503 too many timelines at once.

Threads: the server runs on a daemon thread of its own and answers each request on a new
thread; the checks only read events, locked state and single attribute values, never block.
The replica's main thread sets :attr:`Health.ingest` once and calls :meth:`Health.beat`; the
supervisor's ``on_fatal`` sets :attr:`Health.fatal`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.errors import QueryError, StoreError
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.queries.queries import Answers
from kdelay.delay_service.threads import SupervisedThreads

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

#: A check: None when healthy, else the reason it is not.
Check = Callable[[], str | None]
#: /healthz fails when the control loop has not turned for this long (it turns every second).
CONTROL_STALL_S = 120.0


class Health:
    """A replica's liveness and readiness, from the state its threads leave behind."""

    def __init__(
        self, cfg: ReplicaConfig, supervisor: SupervisedThreads, stopping: threading.Event
    ) -> None:
        self._cfg = cfg
        self._supervisor = supervisor
        self._stopping = stopping
        self._heartbeat = time.monotonic()  # the control loop's last turn
        self.ingest: Ingest | None = None  # set once it exists
        self.fatal: str | None = None  # the component given up on: the process exits

    def beat(self) -> float:
        """The control loop turned; returns the time (``time.monotonic()``)."""
        self._heartbeat = now = time.monotonic()
        return now

    def live(self) -> str | None:
        """Why the process should be restarted, or None (``/healthz``)."""
        if self.fatal is not None:
            return f"{self.fatal} failed {self._cfg.max_component_failures} times in a row"
        if dead := self._supervisor.dead():
            return f"thread ended: {', '.join(dead)}"
        stalled = time.monotonic() - self._heartbeat
        if stalled > CONTROL_STALL_S:
            return f"control loop stalled for {stalled:.0f} s"
        return None

    def ready(self) -> str | None:
        """Why this replica cannot serve (as master or standby), or None (``/readyz``)."""
        if self._stopping.is_set():
            return "stopping"
        ingest = self.ingest
        if ingest is None or not ingest.caught_up.is_set():
            return "catching up with the buffer topic"
        idle = time.monotonic() - ingest.last_progress()
        if idle > self._cfg.ingest_stall_s:
            return f"ingest made no progress for {idle:.0f} s"
        if failed := self._supervisor.backing_off():
            return f"restarting after a failure: {', '.join(failed)}"
        return self.live()


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (probes call every few seconds)."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        return


def _answer(check: Check, start_response: StartResponse) -> Iterable[bytes]:
    reason = check()
    body = json.dumps({"status": "fail" if reason else "ok", "reason": reason or ""}).encode()
    status = "503 Service Unavailable" if reason else "200 OK"
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


_STATUS_LINES = {
    200: "200 OK",
    400: "400 Bad Request",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    503: "503 Service Unavailable",
}
#: The message queries' path prefixes.
MESSAGES = "/v1/messages/"
LISTING = "/v1/messages"
PENDING = "/v1/pending"


def _json(status: int, doc: dict[str, object], start_response: StartResponse) -> Iterable[bytes]:
    body = json.dumps(doc, separators=(",", ":")).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if status == 503:
        headers.append(("Retry-After", "1"))
    if status == 405:
        headers.append(("Allow", "GET"))
    start_response(_STATUS_LINES[status], headers)
    return [body]


def _query(answers: Answers, environ: WSGIEnvironment, path: str) -> tuple[int, dict[str, object]]:
    """The answer to a ``/v1/...`` request (queries.py)."""
    if environ.get("REQUEST_METHOD", "GET") != "GET":
        return 405, QueryError(405, f"{path}: only GET is served here").body()
    try:
        params = {
            k: v[-1] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()
        }
        if path == LISTING:
            return answers.listing(params)
        if path.startswith(MESSAGES):
            # wsgiref decodes PATH_INFO's percent-escapes as ISO-8859-1 (PEP 3333): raw bytes.
            return answers.message(path[len(MESSAGES) :].encode("iso-8859-1"))
        return answers.pending(params)
    except StoreError as exc:  # closed: the replica is shutting down
        return 503, QueryError(503, f"the replica's store cannot answer: {exc}").body()


#: What one bulk cancel did (queries.py, ``Answers.bulk_cancel``).
BULK_CANCELS = "/v1/bulk-cancels/"


def _bulk_cancel(answers: Answers, environ: WSGIEnvironment) -> tuple[int, dict[str, object]]:
    """The answer to ``GET /v1/bulk-cancels/<id>`` (the id percent-encoded)."""
    path = environ.get("PATH_INFO", "")
    if environ.get("REQUEST_METHOD", "GET") != "GET":
        return 405, QueryError(405, f"{path}: only GET is served here").body()
    try:
        # wsgiref decodes PATH_INFO's percent-escapes as ISO-8859-1 (PEP 3333): raw bytes.
        return answers.bulk_cancel(path[len(BULK_CANCELS) :].encode("iso-8859-1"))
    except StoreError as exc:  # closed: the replica is shutting down
        return 503, QueryError(503, f"the replica's store cannot answer: {exc}").body()


def app(
    registry: CollectorRegistry, live: Check, ready: Check, answers: Answers | None = None
) -> WSGIApplication:
    """The WSGI app of the replica's port; without ``answers``, no message queries."""
    metrics = make_wsgi_app(registry)

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _answer(live, start_response)
        if path == "/readyz":
            return _answer(ready, start_response)
        if answers is not None and path.startswith(BULK_CANCELS):
            return _json(*_bulk_cancel(answers, environ), start_response)
        if answers is not None and (path.startswith(MESSAGES) or path in (LISTING, PENDING)):
            status, doc = _query(answers, environ, path)
            return _json(status, doc, start_response)
        body: Iterable[bytes] = metrics(environ, start_response)
        return body

    return serve


def serve(host: str, port: int, wsgi: WSGIApplication) -> int:
    """Serve ``wsgi`` on ``host:port`` (0: a free port) on a daemon thread; the bound port."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(str(sockaddr[0]), port, wsgi, Server, handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    return int(httpd.server_port)
