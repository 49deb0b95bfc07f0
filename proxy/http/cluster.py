"""``GET /v1/cluster``: the delay-service replicas at a glance, for the console's overview (/ui/).

Built from what the replicas already publish, nothing new on their side:

- the ZooKeeper registry (``zk/registry.py`` status nodes, read by ``zk.replica_api``): each
  shard's replicas, their role (so the master of each shard) and ingest lag;
- each replica's ``/metrics`` (Prometheus text, the URL its status node gives): its pending
  count (``kdelay_replica_pending_messages``), the messages it released
  (``kdelay_replica_forwarded_total``) and the lateness of each release
  (``kdelay_replica_lateness_seconds`` histogram).

The release rate and the lateness p50/p99 are "over the last minutes": the proxy keeps, per
replica, the counters it scraped at each call (at most one scrape per :data:`MIN_SCRAPE_S`)
for :data:`WINDOW_S`, and answers the difference between the newest and the oldest sample of
the window, summed over replicas (a master that changed mid-window counts with both; a counter
that went back, a restarted replica, counts from zero). The quantiles interpolate within the
histogram's buckets as Prometheus's ``histogram_quantile`` does. Until two samples exist (the
first call, or a proxy just started) they are null: ``release.span_s`` says how much time the
figures cover. The console polls every few seconds, which keeps the window filled.

Every replica's figures are every principal's: administrators only (403), as ``/v1/pending``;
an open API answers everyone. 503 without ``zk_connect`` or when ZooKeeper cannot be read. A
replica whose ``/metrics`` does not answer is listed with ``"up": false`` and why.

Concurrency: the route runs on the proxy's asyncio loop; the ZooKeeper read and the scrapes run
on worker threads (``asyncio.to_thread``), the scrapes of one call in parallel. The samples are
only touched on the loop.
"""

from __future__ import annotations

import asyncio
import http.client
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy.http.errors import Problem, UnavailableError
from kdelay.proxy.http.messages import CallerParam
from kdelay.proxy.http.queries import AdministratorsOnlyError, ReplicasNotConfiguredError
from kdelay.zk.replica_api import NoReplicaError, Replica, ReplicaApi

#: How far back the release rate and lateness quantiles look.
WINDOW_S: Final = 300.0
#: Calls closer together than this reuse the last scrape.
MIN_SCRAPE_S: Final = 1.0
#: How long one replica's /metrics may take.
SCRAPE_TIMEOUT_S: Final = 2.0

PENDING: Final = "kdelay_replica_pending_messages"
FORWARDED: Final = "kdelay_replica_forwarded"
LATENESS: Final = "kdelay_replica_lateness_seconds"


class ReplicaView(BaseModel):
    """One replica as the overview shows it."""

    name: str
    role: str = Field(description="master, follower, catching-up or starting")
    lag: int | None = Field(description="buffer records not yet ingested (its status node)")
    pending: int | None = Field(description="entries in its store (its /metrics); null: unknown")
    up: bool = Field(description="its /metrics answered")
    error: str | None = Field(default=None, description="why its /metrics did not answer")


class ShardView(BaseModel):
    """One shard (the one replica set of an unsharded service)."""

    shard: int
    master: str | None = Field(description="the replica whose role is master; null: none now")
    replicas: list[ReplicaView]


class ReleaseView(BaseModel):
    """Releases over the last ``span_s`` seconds (at most ``window_s``), every replica summed."""

    window_s: float
    span_s: float = Field(description="the time the figures cover; 0: not measured yet")
    released: int | None = Field(description="messages released in span_s; null: not yet")
    rate_per_s: float | None
    lateness_p50_s: float | None = Field(description="null: nothing released in span_s")
    lateness_p99_s: float | None


class ClusterView(BaseModel):
    """The delay service at a glance (module docstring)."""

    as_of_ms: int
    shards: list[ShardView]
    release: ReleaseView


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one replica's /metrics said."""

    pending: int | None
    forwarded: float
    #: Cumulative lateness histogram: upper bound (inf last) -> count.
    buckets: dict[float, float]


@dataclass(slots=True)
class _Sample:
    at: float
    scrapes: dict[str, Scrape]


@dataclass(slots=True)
class ReleaseWindow:
    """The samples of the last ``window_s`` (module docstring). Loop-only."""

    window_s: float = WINDOW_S
    samples: deque[_Sample] = field(default_factory=deque)

    def add(self, at: float, scrapes: dict[str, Scrape]) -> None:
        self.samples.append(_Sample(at, scrapes))
        while len(self.samples) > 2 and at - self.samples[1].at >= self.window_s:
            self.samples.popleft()

    def view(self) -> ReleaseView:
        empty = ReleaseView(
            window_s=self.window_s,
            span_s=0.0,
            released=None,
            rate_per_s=None,
            lateness_p50_s=None,
            lateness_p99_s=None,
        )
        if len(self.samples) < 2:
            return empty
        first, last = self.samples[0], self.samples[-1]
        span = last.at - first.at
        if span <= 0:
            return empty
        released = 0.0
        buckets: dict[float, float] = {}
        for name, now in last.scrapes.items():
            before = first.scrapes.get(name)
            released += _delta(now.forwarded, before.forwarded if before else 0.0)
            for bound, count in now.buckets.items():
                old = before.buckets.get(bound, 0.0) if before else 0.0
                buckets[bound] = buckets.get(bound, 0.0) + _delta(count, old)
        return ReleaseView(
            window_s=self.window_s,
            span_s=round(span, 3),
            released=int(released),
            rate_per_s=round(released / span, 3),
            lateness_p50_s=quantile(0.5, buckets),
            lateness_p99_s=quantile(0.99, buckets),
        )


def _delta(now: float, before: float) -> float:
    """A counter's increase; one that went back (its process restarted) counts from zero."""
    return now - before if now >= before else now


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The ``q`` quantile of a cumulative histogram (upper bound -> count), interpolated
    linearly within its bucket as Prometheus's ``histogram_quantile``; in the ``+Inf`` bucket,
    the highest finite bound. None when the histogram counts nothing."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            share = (rank - lower_count) / (count - lower_count)
            return round(lower_bound + (bound - lower_bound) * share, 6)
        lower_bound, lower_count = bound, count
    return lower_bound


def parse_metrics(text: str) -> Scrape:
    """The figures the overview needs from a replica's Prometheus text."""
    pending: int | None = None
    forwarded = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == PENDING:
                pending = int(sample.value)
            elif sample.name == FORWARDED + "_total":
                forwarded = float(sample.value)
            elif sample.name == LATENESS + "_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + float(sample.value)
    return Scrape(pending, forwarded, buckets)


def scrape(replica: Replica, timeout_s: float = SCRAPE_TIMEOUT_S) -> Scrape:
    """GET the replica's /metrics (blocking); OSError, HTTPException or ValueError on failure."""
    conn = http.client.HTTPConnection(replica.host, replica.port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise ValueError(f"/metrics answered HTTP {resp.status}")
    return parse_metrics(body.decode("utf-8"))


def _scrape_all(replicas: Iterable[Replica]) -> dict[str, Scrape | str]:
    """Every replica's scrape, in parallel, or why it failed (blocking)."""
    todo = list(replicas)
    out: dict[str, Scrape | str] = {}
    if not todo:
        return out
    with ThreadPoolExecutor(min(len(todo), 8), thread_name_prefix="kdelay-cluster") as pool:
        futures = {r.name: pool.submit(scrape, r) for r in todo}
        for name, future in futures.items():
            try:
                out[name] = future.result()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                out[name] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return out


def install_cluster_route(
    app: FastAPI,
    replicas: ReplicaApi | None,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    window_s: float = WINDOW_S,
) -> None:
    """``GET /v1/cluster`` on ``app`` (module docstring); ``monotonic`` times the samples."""
    window = ReleaseWindow(window_s)
    last: list[tuple[float, dict[str, Scrape | str]]] = []
    errors: dict[int | str, dict[str, Any]] = {c: {"model": Problem} for c in (403, 503)}

    @app.get("/v1/cluster", response_model=ClusterView, responses=errors)
    async def get_cluster(caller: CallerParam) -> Response:
        """Each shard's master and replicas (role, ingest lag, pending count), and the release
        rate and lateness p50/p99 over the last minutes (module docstring). Every replica's
        figures: for kdelay administrators only (403)."""
        if not await caller.admin():
            raise AdministratorsOnlyError(
                f"the cluster overview shows every principal's messages: only a principal "
                f"with ALTER on {BUFFER_TOPIC} (a kdelay administrator) may read it"
            )
        if replicas is None:
            raise ReplicasNotConfiguredError(
                "zk_connect: this proxy does not know where the delay-service replicas are; "
                "set zk_connect (--zk-connect, KDELAY_PROXY_ZK_CONNECT) and zk_root to theirs"
            )
        try:
            shards = await asyncio.to_thread(replicas.shards)
        except NoReplicaError as exc:
            raise UnavailableError(str(exc)) from None
        now = monotonic()
        if last and now - last[0][0] < MIN_SCRAPE_S:
            scraped = last[0][1]
        else:
            scraped = await asyncio.to_thread(_scrape_all, [r for s in shards for r in s])
            last[:] = [(now, scraped)]
            window.add(now, {n: s for n, s in scraped.items() if isinstance(s, Scrape)})
        views = []
        for i, members in enumerate(shards):
            listed = []
            for r in members:
                got = scraped.get(r.name)
                ok = isinstance(got, Scrape)
                listed.append(
                    ReplicaView(
                        name=r.name,
                        role=r.role,
                        lag=r.lag,
                        pending=got.pending if isinstance(got, Scrape) else None,
                        up=ok,
                        error=None if ok else str(got or "not scraped yet"),
                    )
                )
            master = next((r.name for r in members if r.role == "master"), None)
            views.append(ShardView(shard=i, master=master, replicas=listed))
        doc = ClusterView(as_of_ms=int(time.time() * 1000), shards=views, release=window.view())
        return JSONResponse(doc.model_dump())
