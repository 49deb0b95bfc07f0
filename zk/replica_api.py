"""Ask the delay-service replicas about messages: found through ZooKeeper, asked over HTTP.

The proxy's ``GET /v1/messages/{id}``, ``GET /v1/messages`` (the listing) and ``GET
/v1/pending``, ``kdelay status --id`` and ``kdelay list`` use it (docs/status.md). It needs
``zk`` (the registry the replicas publish to), kazoo and the standard library, never a
component's internals: the proxy uses it without knowing delay_service.

Discovery: every replica publishes a status znode (``zk/registry.py``) with its ``role`` and
its ``metrics`` URL, ``http://<advertised host>:<port>/metrics``; that HTTP port answers the
queries (``delay_service/health.py``, ``delay_service/queries/queries.py``). Replicas are asked in
this order: the master (it releases, so its store is the reference), then followers by
ingest lag, then the rest (catching up). The first to answer 200, 400 or 404 gives the
answer, which states its own freshness (which replica, its role, its lag). One that refuses
the connection, does not connect within ``connect_timeout_s``, does not answer in time or
answers anything else (a 503 while it stops, a replica without the queries) is passed over.
All the attempts of one question share one deadline; each but the last may use half of the
time left (so a hung master, which accepts connections and never answers, leaves time for the
followers). When none answers: NoReplicaError, naming each replica and why.

The replica list is read from ZooKeeper at most once per ``cache_s``; while ZooKeeper is
unreachable the last list read is used (the replicas may well answer meanwhile). ``security``
(``zk/security.py``) logs the session in and connects over TLS as the replicas do: with ACLs
on the replicas' znodes, an anonymous reader gets NoAuth.

Threads: blocking calls (kazoo, http.client); the proxy runs them on worker threads
(``asyncio.to_thread``). One :class:`ReplicaApi` serves any number of threads at once: kazoo's
client is thread-safe, and the session and the cached list are behind a lock.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

from kdelay.errors import KdelayError
from kdelay.zk.connection import RECONNECT
from kdelay.zk.errors import CoordinationError, zk_errors
from kdelay.zk.layout import shard_paths
from kdelay.zk.list_merge import merge_pages
from kdelay.zk.paths import DEFAULT_ROOT, Paths
from kdelay.zk.registry import members
from kdelay.zk.security import ZkSecurity
from kdelay.zk.shard_merge import merge_pending

#: Replica statuses whose answers are returned (any other is passed over).
ANSWERS = frozenset({200, 400, 404})
_RANK = {"master": 0, "follower": 1}
_ZK_SESSION_S = 10.0


class NoReplicaError(KdelayError):
    """No replica answered (none registered, none reachable, ZooKeeper unreachable before the
    first list was read); the message says why, replica by replica."""


@dataclass(frozen=True, slots=True)
class Replica:
    """A registered replica, as its status znode describes it."""

    name: str
    role: str
    lag: int | None
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class ReplicaAnswer:
    """A replica's answer: its HTTP status (200, 400 or 404) and JSON document."""

    status: int
    body: dict[str, Any]
    replica: str


def ordered(statuses: dict[str, dict[str, Any]]) -> list[Replica]:
    """The replicas to ask, in order (module docstring), from their status documents; those
    without a usable URL are left out."""
    out = []
    for name, doc in statuses.items():
        try:
            url = urllib.parse.urlsplit(str(doc.get("metrics") or ""))
            host, port = url.hostname, url.port
        except ValueError:
            continue
        if not host or not port:
            continue
        lag = doc.get("lag")
        out.append(
            Replica(
                name,
                str(doc.get("role", "unknown")),
                lag if isinstance(lag, int) else None,
                host,
                port,
            )
        )
    out.sort(key=lambda r: (_RANK.get(r.role, 2), 2**63 if r.lag is None else r.lag, r.name))
    return out


class ReplicaApi:
    """The replicas of the delay set under ``zk_root`` in ZooKeeper at ``zk_connect``: of
    each of its shards (``zk/layout.py``), or of its one replica set.

    ``timeout_s``: how long one question may take in all, connecting included (a timeline
    asks with its own, longer, timeout); ``connect_timeout_s``: how long one connection may
    take; ``security``: ZooKeeper credentials and TLS; ``client_factory``: makes the ZooKeeper
    client from KazooClient's arguments (tests pass one that starts nothing). Call
    :meth:`close` when done.
    """

    def __init__(
        self,
        zk_connect: str,
        zk_root: str = DEFAULT_ROOT,
        *,
        timeout_s: float = 2.0,
        connect_timeout_s: float = 1.0,
        cache_s: float = 1.0,
        security: ZkSecurity | None = None,
        client_factory: Callable[..., KazooClient] = KazooClient,
    ) -> None:
        self.zk_connect = zk_connect
        self._client_factory = client_factory
        self._kazoo = security.kazoo_kwargs() if security is not None else {}
        self.paths = Paths(zk_root)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._client: KazooClient | None = None
        self._cached: list[list[Replica]] | None = None
        self._cached_at = 0.0

    # -- questions -------------------------------------------------------------------------

    def message(self, msg_id: str) -> ReplicaAnswer:
        """``GET /v1/messages/<id>`` of the first replica that answers; with shards, the
        shard that knows the id answers (404 only when every shard says so)."""
        path = "/v1/messages/" + urllib.parse.quote(msg_id, safe="")
        answers = self._ask_shards(path, self.timeout_s)
        for wanted in (200, 400):
            found = [a for a in answers if a.status == wanted]
            if found:
                return found[0]
        if len(answers) == 1:
            return answers[0]
        asked = ", ".join(a.replica for a in answers)
        error = (
            f"id: no message {msg_id!r} is pending in any of the {len(answers)} shards, and "
            f"none remembers one that left (asked {asked})"
        )
        return ReplicaAnswer(404, {"error": error, "field": "id"}, asked)

    def pending(
        self,
        bucket: str,
        horizon: str,
        timeout_s: float | None = None,
        *,
        topic: str | None = None,
        id_prefix: str | None = None,
    ) -> ReplicaAnswer:
        """``GET /v1/pending?bucket=..&horizon=..`` (only ``topic``'s, only ids starting with
        ``id_prefix``, when given) of the first replica that answers; with shards, one per
        shard, merged (``zk/shard_merge.py``)."""
        filters = {"topic": topic, "id_prefix": id_prefix}
        query = urllib.parse.urlencode(
            {"bucket": bucket, "horizon": horizon, **{k: v for k, v in filters.items() if v}}
        )
        answers = self._ask_shards(f"/v1/pending?{query}", timeout_s or self.timeout_s)
        bad = [a for a in answers if a.status != 200]
        if bad or len(answers) == 1:
            return (bad or answers)[0]
        return ReplicaAnswer(
            200, merge_pending([a.body for a in answers]), ",".join(a.replica for a in answers)
        )

    def list_pending(
        self, params: dict[str, str], limit: int, timeout_s: float | None = None
    ) -> ReplicaAnswer:
        """``GET /v1/messages?state=pending&..&limit=..`` (``params``: the filters and cursor)
        of the first replica that answers; with shards, one page per shard, merged
        (``zk/list_merge.py``)."""
        query = urllib.parse.urlencode({**params, "state": "pending", "limit": str(limit)})
        answers = self._ask_shards(f"/v1/messages?{query}", timeout_s or self.timeout_s)
        bad = [a for a in answers if a.status != 200]
        if bad or len(answers) == 1:
            return (bad or answers)[0]
        return ReplicaAnswer(
            200, merge_pages([a.body for a in answers], limit), ",".join(a.replica for a in answers)
        )

    def message_in(self, msg_id: str, buffer_partition: int) -> ReplicaAnswer:
        """``GET /v1/messages/<id>`` of the shard that owns ``buffer_partition`` (shard ``p %
        shards``, kdelay/shards.py; the master first), with that replica's freshness."""
        shards = self.shards()
        path = "/v1/messages/" + urllib.parse.quote(msg_id, safe="")
        deadline = time.monotonic() + self.timeout_s
        return self._ask_set(shards[buffer_partition % len(shards)], path, deadline)

    def bulk_cancel(self, bulk_id: str) -> ReplicaAnswer:
        """``GET /v1/bulk-cancels/<id>`` of each shard (its master first): 200 with the
        counts summed over the shards that applied it (``{"id", "cancelled", "refused",
        "shards", "partitions"}``; ``partitions``: those whose copy they applied, each as often
        as a shard listed it, for a bulk cancel written as one copy per buffer partition), else
        the first other answer (404: no shard has read it yet). For a bulk cancel of one
        record per shard (its answers list no partitions), 200 only once every shard has."""
        path = "/v1/bulk-cancels/" + urllib.parse.quote(bulk_id, safe="")
        answers = self._ask_shards(path, self.timeout_s)
        good = [a for a in answers if a.status == 200]
        copies = bool(good) and all(isinstance(a.body.get("partitions"), list) for a in good)
        if not good or (len(good) < len(answers) and not copies):
            return next(a for a in answers if a.status != 200)
        replicas = ",".join(a.replica for a in good)
        doc = {
            "id": bulk_id,
            "cancelled": sum(int(a.body.get("cancelled", 0)) for a in good),
            "refused": sum(int(a.body.get("refused", 0)) for a in good),
            "shards": len(good),
            "answered_by": replicas,
            "role": ",".join(str(a.body.get("role")) for a in good),
        }
        if copies:
            doc["partitions"] = sorted(p for a in good for p in a.body["partitions"])
        return ReplicaAnswer(200, doc, replicas)

    def shard_count(self) -> int:
        """How many shards the delay set has (1 without shards); NoReplicaError when ZooKeeper
        cannot say."""
        return len(self.shards())

    def ask(self, path: str, timeout_s: float | None = None) -> ReplicaAnswer:
        """GET ``path`` from shard 0's replicas in order until one answers (module docstring)."""
        shards = self.shards()
        return self._ask_set(shards[0], path, time.monotonic() + (timeout_s or self.timeout_s))

    def _ask_shards(self, path: str, timeout_s: float) -> list[ReplicaAnswer]:
        """One answer per shard, asked at once, shard 0 first; NoReplicaError when a shard
        gives none (its messages cannot be told apart from unknown ones then)."""
        shards = self.shards()
        deadline = time.monotonic() + timeout_s
        if len(shards) == 1:
            return [self._ask_set(shards[0], path, deadline)]
        with ThreadPoolExecutor(len(shards), thread_name_prefix="kdelay-shard-ask") as pool:
            futures = [pool.submit(self._ask_set, r, path, deadline) for r in shards]
            answers: list[ReplicaAnswer] = []
            failed: list[str] = []
            for i, future in enumerate(futures):
                try:
                    answers.append(future.result())
                except NoReplicaError as exc:
                    failed.append(f"shard {i}: {exc}")
        if failed:
            raise NoReplicaError("; ".join(failed))
        return answers

    def _ask_set(self, replicas: list[Replica], path: str, deadline: float) -> ReplicaAnswer:
        """GET ``path`` from one replica set's ``replicas`` in order until one answers."""
        if not replicas:
            raise NoReplicaError(
                f"no delay-service replica is registered under {self.paths.root} in ZooKeeper "
                f"at {self.zk_connect}"
            )
        passed: list[str] = []
        for i, replica in enumerate(replicas):
            left = deadline - time.monotonic()
            if left <= 0:
                passed.append(f"{replica.name}: not asked, out of time")
                continue
            # Half of the time left, all of it for the last: the first asked (the master)
            # gets the most, and one that accepts but never answers cannot take it all.
            budget = left if i == len(replicas) - 1 else left / 2
            try:
                status, body = self._get(replica, path, budget)
            except (OSError, http.client.HTTPException, ValueError, TypeError) as exc:
                passed.append(f"{replica.name} ({replica.role}): {_reason(exc)}")
                continue
            if status in ANSWERS:
                return ReplicaAnswer(status, body, replica.name)
            passed.append(f"{replica.name} ({replica.role}): HTTP {status} {body.get('error', '')}")
        raise NoReplicaError("no delay-service replica answered: " + "; ".join(passed))

    def _get(self, replica: Replica, path: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection(
            replica.host, replica.port, timeout=min(self.connect_timeout_s, timeout_s)
        )
        try:
            conn.connect()
            conn.sock.settimeout(timeout_s)
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise TypeError("the answer is not a JSON object")
        return resp.status, doc

    # -- discovery -------------------------------------------------------------------------

    def shards(self) -> list[list[Replica]]:
        """Per shard (``zk/layout.py``; one without shards), its registered replicas in the
        order they are asked; cached for ``cache_s``."""
        errors: tuple[type[Exception], ...] = (CoordinationError, *zk_errors())
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached_at < self.cache_s:
                return self._cached
            try:
                client = self._session()
                found = [ordered(members(client, p)) for p in shard_paths(client, self.paths)]
            except errors as exc:
                if self._cached is not None:
                    return self._cached  # the replicas may answer while ZooKeeper does not
                raise NoReplicaError(
                    f"ZooKeeper at {self.zk_connect} did not say where the replicas are: "
                    f"{_reason(exc)}"
                ) from None
            self._cached, self._cached_at = found, now
            return found

    def _session(self) -> KazooClient:
        """The ZooKeeper client, started on first use (kazoo reconnects it by itself)."""
        if self._client is None:
            client = self._client_factory(
                hosts=self.zk_connect,
                timeout=_ZK_SESSION_S,
                connection_retry=dict(RECONNECT),
                **self._kazoo,
            )
            # start() stops and closes the client when it times out: a new one next time.
            client.start(timeout=max(self.timeout_s, self.connect_timeout_s))
            self._client = client
        return self._client

    def close(self) -> None:
        """Close the ZooKeeper session (idempotent)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.stop()
                client.close()
            except zk_errors():
                pass


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
