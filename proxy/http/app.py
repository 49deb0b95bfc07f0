"""The proxy's HTTP API (CONTRACT.md): the FastAPI application, health, readiness, metrics.

Runs on the same asyncio loop as the Kafka listener (uvicorn). :func:`create_app` builds the
application: the body limits and request counting every route shares, the message routes
(proxy/http/messages.py: schedule and cancel, written upstream), the query routes that a
delay-service replica answers (proxy/http/queries.py: a message's status, the pending
timeline; proxy/http/cluster.py: the replicas' overview), the operator's console at ``/ui/``
(proxy/http/console.py), and ``/healthz``, ``/readyz`` and ``/metrics`` (here). With an ``auth``
authenticator (``http_auth = "kafka"``, proxy/http/login.py) every other path needs credentials
Kafka accepts, checked before the body is read; the routes act for
``proxy.http.auth.current_caller``. Every error is JSON ``{"error": ...}`` naming the field or
setting at fault, with the statuses of proxy/http/errors.py; the application never uses the
Kafka listener's broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from kdelay import clock
from kdelay.headers import DelayPolicy
from kdelay.proxy import metric_labels
from kdelay.proxy.auth.owners import Owners
from kdelay.proxy.budget import RequestBudget
from kdelay.proxy.http import errors as http_errors
from kdelay.proxy.http.auth import STATE_AUTHENTICATES
from kdelay.proxy.http.authenticate import Authenticate
from kdelay.proxy.http.body import BodyLimit
from kdelay.proxy.http.cancels import install_cancel_routes
from kdelay.proxy.http.cluster import install_cluster_route
from kdelay.proxy.http.console import install_console
from kdelay.proxy.http.errors import Problem, UnavailableError
from kdelay.proxy.http.login import HttpAuthenticator
from kdelay.proxy.http.messages import install_message_routes
from kdelay.proxy.http.queries import install_replica_queries
from kdelay.proxy.limits import RecordLimits
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.buffer_keys import ACCEPTANCE_ORDER, AcceptanceOrder
from kdelay.proxy.routing.cancel_acks import CancelAcks
from kdelay.proxy.routing.route import DEFAULT_LIMITS
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.availability import UpstreamAvailability
from kdelay.proxy.upstream.producer import Upstream
from kdelay.zk.replica_api import ReplicaApi


class Status(BaseModel):
    """Health or readiness."""

    status: str


def _install_common(
    app: FastAPI,
    metrics: ProxyMetrics,
    max_body_bytes: int,
    budget: RequestBudget | None,
    auth: HttpAuthenticator | None,
    *,
    body_timeout_s: float,
) -> None:
    """The body limits, authentication, request counting, and the one error shape
    (proxy/http/errors.py, proxy/http/body.py). Authentication runs outside the body limits (an
    unauthenticated body is never read nor budgeted) and inside the request counting (a 401 is
    counted)."""
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, budget=budget, timeout_s=body_timeout_s)
    if auth is not None:
        app.add_middleware(Authenticate, authenticator=auth)
        setattr(app.state, STATE_AUTHENTICATES, True)
    http_errors.install(app, metrics)
    #: The application's route templates, the only route labels (proxy/metric_labels.py).
    routes: set[str] = set()

    @app.middleware("http")
    async def count_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        if not routes:
            routes.update(str(getattr(r, "path", "")) for r in request.app.routes)
        metrics.http_requests.labels(
            metric_labels.http_method(request.method),
            metric_labels.http_route(request.scope.get("route"), routes),
            metric_labels.http_status(response.status_code),
        ).inc()
        return response


def create_app(
    topics: Topics,
    upstream: Upstream,
    metrics: ProxyMetrics,
    policy: DelayPolicy,
    *,
    now_ms: Callable[[], int] = clock.now_ms,
    limits: RecordLimits = DEFAULT_LIMITS,
    not_ready: Callable[[], str | None] = lambda: None,
    max_body_bytes: int = 100 * 1024 * 1024,
    budget: RequestBudget | None = None,
    availability: UpstreamAvailability | None = None,
    replicas: ReplicaApi | None = None,
    pending_timeout_s: float = 60.0,
    order: AcceptanceOrder = ACCEPTANCE_ORDER,
    cancel_acks: CancelAcks | None = None,
    auth: HttpAuthenticator | None = None,
    body_timeout_s: float = 30.0,
) -> FastAPI:
    """The FastAPI application of one proxy: it looks topics up in ``topics`` (the Kafka
    listener's cache) and writes through ``upstream``; ``not_ready`` says why the proxy is not
    ready (a supervised component is down), or None. A body over ``max_body_bytes`` is refused;
    ``budget`` is the process-wide request budget the Kafka listener also draws on;
    ``availability`` (``upstream.availability``) whether upstream is down, for ``/readyz`` and
    for answering writes 503 at once meanwhile; ``replicas`` answers the status and timeline
    questions (None: they answer 503 naming ``zk_connect``), a timeline within
    ``pending_timeout_s``; ``order`` stamps acceptance (the proxy's: on the broker's clock) and
    ``cancel_acks`` holds a cancel's answer (proxy/routing/cancel_acks.py); ``auth`` authenticates
    every request but ``/healthz``, ``/readyz`` and ``/metrics`` (None: the API is open); a
    body must arrive within ``body_timeout_s`` (``http_body_timeout_ms``)."""
    app = FastAPI(
        title="kdelay proxy",
        version="1",
        description="Delayed and scheduled messages for Apache Kafka: the proxy's HTTP API.",
    )

    _install_common(app, metrics, max_body_bytes, budget, auth, body_timeout_s=body_timeout_s)

    owners = Owners(lambda: replicas)
    write_cancel = install_message_routes(
        app,
        topics,
        upstream,
        metrics,
        policy,
        now_ms=now_ms,
        limits=limits,
        availability=availability,
        order=order,
        cancel_acks=cancel_acks,
        owners=owners,
    )
    install_cancel_routes(app, topics, metrics, owners, write_cancel)
    install_replica_queries(app, replicas, pending_timeout_s)
    install_cluster_route(app, replicas)
    install_console(app)

    @app.get("/healthz", response_model=Status)
    async def healthz() -> Status:
        """The process is up."""
        return Status(status="ok")

    @app.get("/readyz", response_model=Status, responses={503: {"model": Problem}})
    async def readyz() -> Status:
        """Every component runs and upstream Kafka answers; 503 names what is not ready."""
        why = not_ready()
        if why is not None:
            raise UnavailableError(why)
        down = None if availability is None else availability.problem()
        if down is None and not await asyncio.to_thread(upstream.reachable):
            # reachable() marked upstream down: the reason every other answer gives.
            down = None if availability is None else availability.problem()
            down = down or f"upstream Kafka at {upstream.bootstrap} is unreachable"
        if down is not None:
            raise UnavailableError(down)
        return Status(status="ready")

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format)."""
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
