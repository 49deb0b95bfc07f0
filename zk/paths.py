"""Where a replica set keeps its state in ZooKeeper.

Everything lives under one root, default ``/kdelay/default``; the last component names the
shard or cluster, so several replica sets can share one ZooKeeper.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ROOT = "/kdelay/default"


@dataclass(frozen=True, slots=True)
class Paths:
    """The znodes of one replica set."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or self.root.endswith("/") or "//" in self.root:
            raise ValueError(f"ZooKeeper root {self.root!r} must be an absolute path like /a/b")

    @property
    def election(self) -> str:
        """Parent of the candidates' ephemeral sequential nodes."""
        return f"{self.root}/election"

    @property
    def replicas(self) -> str:
        """Parent of the replicas' ephemeral status nodes."""
        return f"{self.root}/replicas"

    @property
    def epoch(self) -> str:
        """The epoch znode: its version is the current master's fencing token."""
        return f"{self.root}/epoch"

    @property
    def checkpoint(self) -> str:
        """The checkpoint znode (one JSON document)."""
        return f"{self.root}/checkpoint"

    @property
    def layout(self) -> str:
        """The delay set's shard layout (``zk/layout.py``); on the set's root, not a shard's."""
        return f"{self.root}/layout"

    def shard(self, shard: int, shards: int) -> Paths:
        """The znodes of shard ``shard`` of ``shards``: the set's own root for one shard (as
        before shards existed), ``<root>/shard-<i>`` otherwise."""
        return self if shards == 1 else Paths(f"{self.root}/shard-{shard}")
