"""A delay set's shard layout: ``<root>/layout`` holds ``{"shards": N}``.

Shard ``i`` of ``N`` is a replica set of its own under :meth:`Paths.shard` (one shard: the set's
root itself). The first replica to start writes the layout; every replica checks its own
``--shards`` against it and refuses to start on a mismatch, so two layouts never forward the
same partitions. Only ``kdelay reshard`` (``delay_service/reshard/reshard.py``) changes it, while no
replica runs.

What a shard owns is not zk's business (``kdelay/shards.py`` says it); this module only keeps
the number and finds the shards' paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from kdelay.zk.errors import CoordinationError, zk_errors
from kdelay.zk.paths import Paths
from kdelay.zk.registry import cluster_status

LAYOUT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Layout:
    """How many shards divide the delay set's buffer partitions."""

    shards: int

    def encode(self) -> bytes:
        return json.dumps({"version": LAYOUT_VERSION, "shards": self.shards}).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> Layout:
        try:
            doc = json.loads(data)
            shards = doc["shards"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CoordinationError(f"{where} holds no shard layout: {exc!r}") from None
        if not isinstance(shards, int) or shards < 1:
            raise CoordinationError(f"{where}: shards must be a positive integer, not {shards!r}")
        return cls(shards)


def read_layout(client: KazooClient, paths: Paths) -> Layout | None:
    """The layout under ``paths`` (the set's root), or None when no replica wrote one yet."""
    try:
        data, _ = client.get(paths.layout)
    except NoNodeError:
        return None
    except zk_errors() as exc:
        raise CoordinationError(f"cannot read {paths.layout}: {exc!r}") from None
    return Layout.decode(bytes(data), paths.layout) if data else None


def ensure_layout(client: KazooClient, paths: Paths, shards: int) -> Layout:
    """The layout under ``paths``, written as ``shards`` shards if there is none yet. The caller
    compares it with its own (a mismatch means another layout's replicas may be running)."""
    try:
        client.create(paths.layout, Layout(shards).encode(), makepath=True)
    except NodeExistsError:
        pass
    except zk_errors() as exc:
        raise CoordinationError(f"cannot write {paths.layout}: {exc!r}") from None
    found = read_layout(client, paths)
    if found is None:  # an empty node (created by hand): this replica's layout fills it
        write_layout(client, paths, Layout(shards))
        return Layout(shards)
    return found


def write_layout(client: KazooClient, paths: Paths, layout: Layout) -> None:
    """Replace the layout (``kdelay reshard``, with every replica stopped)."""
    try:
        client.ensure_path(paths.layout)
        client.set(paths.layout, layout.encode())
    except zk_errors() as exc:
        raise CoordinationError(f"cannot write {paths.layout}: {exc!r}") from None


def shard_paths(client: KazooClient, paths: Paths) -> list[Paths]:
    """The replica sets of the delay set under ``paths``, shard 0 first (one when no layout
    was written: an unsharded set, or one whose replicas never started)."""
    layout = read_layout(client, paths)
    shards = 1 if layout is None else layout.shards
    return [paths.shard(i, shards) for i in range(shards)]


def delay_set_status(client: KazooClient, paths: Paths) -> dict[str, Any]:
    """``kdelay status --json`` (CONTRACT.md): shard 0's ``master``, ``master_state`` and
    ``checkpoint`` at the top (as before shards), every replica in ``replicas`` (each with its
    ``shard``), and per shard ``{"shard", "master", "master_state", "replicas", "checkpoint"}``
    in ``shards``."""
    shards = []
    for i, shard in enumerate(shard_paths(client, paths)):
        doc = cluster_status(client, shard)
        for replica in doc["replicas"]:
            replica.setdefault("shard", i)
        shards.append({"shard": i, "root": shard.root, **doc})
    first = shards[0]
    top = {k: v for k, v in first.items() if k not in ("shard", "root", "replicas")}
    return {
        **top,
        "replicas": [r for s in shards for r in s["replicas"]],
        "shards": shards,
    }
