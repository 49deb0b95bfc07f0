"""Membership: each replica's ephemeral status node, and the cluster view ``kdelay status`` shows.

A replica publishes ``<root>/replicas/<name>`` (ephemeral JSON: name, role, ingested offsets,
lag, pending count, metrics URL ...) and refreshes it periodically from its control thread.
The cluster view passes those documents, and the checkpoint document, on as JSON objects
without interpreting their fields, with one exception: whether the elected master is *live*.

A SIGKILLed master's election node lives until ZooKeeper expires its session (the session
timeout, rounded up to a tick), so "lowest candidate" alone keeps naming a dead master for
that long. The view calls the master ``stale`` (``"master": null``, ``"master_state":
"stale"``, ``"stale_master": {"name", "node", "reason"}``) when
- its status node was not refreshed for ``stale_after_s`` (5 s: a live replica refreshes it
  every status interval, 1 s by default), or
- its status node was rewritten more than a second after the election node was created yet
  names another candidate node (``candidate``): a restarted process of that name publishes
  while the leading node still belongs to the session of the one that died (a replica
  publishes from the thread that joins, so its own documents name its node at once), or
- it has no status node at all ``stale_after_s`` after the election node was created.
Ages are differences of ZooKeeper's own timestamps (``mtime``/``ctime``), measured against the
newest status update, or this machine's clock when that is later; so only a reader whose clock
runs ahead of ZooKeeper's by about ``stale_after_s`` could see a live master as stale.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from kdelay.zk.checkpoint import read_checkpoint
from kdelay.zk.election import Candidate, leading_candidate
from kdelay.zk.errors import CoordinationError, zk_errors
from kdelay.zk.paths import Paths

#: ZooKeeper stamps ``ctime``/``mtime`` with the clock of the server that committed the write:
#: allow for two servers' clocks apart.
_REJOIN_GRACE_MS = 1_000


class Registry:
    """Publishes one replica's status."""

    def __init__(self, client: KazooClient, paths: Paths, name: str) -> None:
        if not name or "/" in name:
            raise ValueError(f"replica name {name!r} must be non-empty and contain no '/'")
        self._client = client
        self._path = f"{paths.replicas}/{name}"

    def publish(self, status: dict[str, Any]) -> None:
        """Create or update the status node (ephemeral: it vanishes with the session)."""
        data = json.dumps(status, separators=(",", ":"), sort_keys=True).encode()
        try:
            try:
                self._client.set(self._path, data)
            except NoNodeError:
                try:
                    self._client.create(self._path, data, ephemeral=True, makepath=True)
                except NodeExistsError:
                    # The previous session's node lingers until that session expires.
                    self._client.set(self._path, data)
        except zk_errors() as exc:
            raise CoordinationError(f"cannot publish status: {exc!r}") from None

    def withdraw(self) -> None:
        """Delete the status node (graceful shutdown)."""
        try:
            self._client.delete(self._path)
        except NoNodeError:
            pass
        except zk_errors() as exc:
            raise CoordinationError(f"cannot withdraw status: {exc!r}") from None


def _status_nodes(client: KazooClient, paths: Paths) -> dict[str, tuple[dict[str, Any], int]]:
    """Every registered replica's last published status and its mtime (ms), by name."""
    out: dict[str, tuple[dict[str, Any], int]] = {}
    try:
        names = client.get_children(paths.replicas)
    except NoNodeError:
        return out
    for name in sorted(names):
        try:
            data, stat = client.get(f"{paths.replicas}/{name}")
        except NoNodeError:
            continue
        try:
            status = json.loads(data)
        except ValueError:
            status = {}
        out[name] = (status if isinstance(status, dict) else {}, int(stat.mtime))
    return out


def members(client: KazooClient, paths: Paths) -> dict[str, dict[str, Any]]:
    """Every registered replica's last published status, by name."""
    return {name: status for name, (status, _) in _status_nodes(client, paths).items()}


def _stale_reason(
    leading: Candidate,
    nodes: dict[str, tuple[dict[str, Any], int]],
    now_ms: int,
    stale_after_ms: int,
) -> str | None:
    """Why the leading candidate's replica is not a live master, or None if it may be."""
    created = int(leading.stat.ctime)
    if leading.name not in nodes:
        if now_ms - created > stale_after_ms:
            return f"{leading.name} has no status node; its election node waits for its session"
        return None
    status, updated = nodes[leading.name]
    age = now_ms - updated
    if age > stale_after_ms:
        return (
            f"no status update from {leading.name} for {age / 1000:.1f} s: its process is "
            "probably gone; its election node lasts until ZooKeeper expires its session"
        )
    candidate = status.get("candidate", leading.node)  # a replica that does not say: no claim
    if candidate != leading.node and updated - created > _REJOIN_GRACE_MS:
        return (
            f"{leading.name} (pid {status.get('pid')}) holds candidate {candidate}, not the "
            f"leading node {leading.node}: that belongs to an earlier session of the same name, "
            "waiting to expire"
        )
    return None


def cluster_status(
    client: KazooClient, paths: Paths, *, stale_after_s: float = 5.0
) -> dict[str, Any]:
    """``{"master", "master_state", "replicas": [{"name", "role", "lag", "pending", ...}],
    "checkpoint"}``, plus ``"stale_master"`` when the elected master is not live (see the
    module docstring); ``"master_state"`` is ``live``, ``stale`` or ``none``."""
    leading = leading_candidate(client, paths)
    nodes = _status_nodes(client, paths)
    replicas = []
    for name, (status, _) in nodes.items():
        replicas.append(
            {
                **status,
                "name": name,
                "role": status.get("role", "unknown"),
                "lag": status.get("lag"),
                "pending": status.get("pending"),
            }
        )
    doc: dict[str, Any] = {"master": None, "master_state": "none", "replicas": replicas}
    if leading is not None:
        newest = max((updated for _, updated in nodes.values()), default=0)
        now_ms = max(int(time.time() * 1000), newest)
        reason = _stale_reason(leading, nodes, now_ms, int(stale_after_s * 1000))
        if reason is None:
            doc.update(master=leading.name, master_state="live")
        else:
            doc["master_state"] = "stale"
            doc["stale_master"] = {"name": leading.name, "node": leading.node, "reason": reason}
    doc["checkpoint"] = _checkpoint_document(read_checkpoint(client, paths))
    return doc


def _checkpoint_document(data: bytes | None) -> dict[str, Any]:
    """The checkpoint znode as a JSON object, ``{}`` when none was written yet."""
    if data is None:
        return {}
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise CoordinationError(f"checkpoint znode holds no JSON document: {exc}") from None
    if not isinstance(doc, dict):
        raise CoordinationError("checkpoint znode holds no JSON object")
    return doc


__all__ = ["CoordinationError", "Registry", "cluster_status", "members"]
