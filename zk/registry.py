"""Membership: each replica's ephemeral status node, and the cluster view ``kdelay status`` shows.

A replica publishes ``<root>/replicas/<name>`` (ephemeral JSON: name, role, ingested offsets,
lag, pending count, metrics URL ...) and refreshes it periodically from its control thread.
The cluster view passes those documents, and the checkpoint document, on as JSON objects
without interpreting their fields.
"""

from __future__ import annotations

import json
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from zk.checkpoint import read_checkpoint
from zk.election import current_leader
from zk.errors import CoordinationError, zk_errors
from zk.paths import Paths


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


def members(client: KazooClient, paths: Paths) -> dict[str, dict[str, Any]]:
    """Every registered replica's last published status, by name."""
    out: dict[str, dict[str, Any]] = {}
    try:
        names = client.get_children(paths.replicas)
    except NoNodeError:
        return out
    for name in sorted(names):
        try:
            data, _ = client.get(f"{paths.replicas}/{name}")
        except NoNodeError:
            continue
        try:
            status = json.loads(data)
        except ValueError:
            status = {}
        out[name] = status if isinstance(status, dict) else {}
    return out


def cluster_status(client: KazooClient, paths: Paths) -> dict[str, Any]:
    """``{"master", "replicas": [{"name", "role", "lag", "pending", ...}], "checkpoint"}``."""
    master = current_leader(client, paths)
    replicas = []
    for name, status in members(client, paths).items():
        replicas.append(
            {
                **status,
                "name": name,
                "role": status.get("role", "unknown"),
                "lag": status.get("lag"),
                "pending": status.get("pending"),
            }
        )
    return {
        "master": master,
        "replicas": replicas,
        "checkpoint": _checkpoint_document(read_checkpoint(client, paths)),
    }


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
