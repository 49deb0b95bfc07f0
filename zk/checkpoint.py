"""The fenced checkpoint: ``(T, {partition: offset}, epoch, writer)`` in one znode.

Fencing: a master wins an *epoch* by bumping the epoch znode's version (a conditional set, so
two winners cannot get the same number). Every checkpoint write is one ZooKeeper transaction
``check(epoch, version=my epoch) + set_data(checkpoint, version=last seen)``: once a newer master
has claimed its epoch, a deposed master's write fails with :class:`FencedError` and it must stop
forwarding at once.

Thread-safety: a CheckpointStore is used by one thread at a time (the forwarder, or the control
thread before the forwarder starts); kazoo's client itself is thread-safe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

from zk.errors import CoordinationError, FencedError, zk_errors
from zk.paths import Paths


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Every buffer record with offset < ``offsets[p]`` and deliver-at <= ``time_ms`` is done."""

    time_ms: int
    offsets: Mapping[int, int]
    epoch: int
    writer: str
    written_at_ms: int = 0
    version: int = field(default=-1, compare=False)

    def covers(self, partition: int, offset: int, deliver_at_ms: int) -> bool:
        return deliver_at_ms <= self.time_ms and offset < self.offsets.get(partition, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "time_ms": self.time_ms,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "epoch": self.epoch,
            "writer": self.writer,
            "written_at_ms": self.written_at_ms,
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, version: int = -1) -> Checkpoint:
        try:
            obj = json.loads(data)
            return cls(
                time_ms=int(obj["time_ms"]),
                offsets={int(p): int(o) for p, o in obj["offsets"].items()},
                epoch=int(obj["epoch"]),
                writer=str(obj["writer"]),
                written_at_ms=int(obj.get("written_at_ms", 0)),
                version=version,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CoordinationError(f"checkpoint znode holds no valid checkpoint: {exc}") from None


def read_checkpoint(client: KazooClient, paths: Paths) -> Checkpoint | None:
    """The current checkpoint, or None when no master has written one yet."""
    try:
        data, stat = client.get(paths.checkpoint)
    except NoNodeError:
        return None
    if not data:
        return None
    return Checkpoint.decode(data, stat.version)


class CheckpointStore:
    """Claims epochs and writes fenced checkpoints for one replica (``writer``)."""

    def __init__(self, client: KazooClient, paths: Paths, writer: str) -> None:
        self._client = client
        self._paths = paths
        self._writer = writer
        self.epoch: int | None = None
        self._version = -1

    def claim_epoch(self) -> int:
        """Become the newest epoch holder; any older master's next write is fenced."""
        try:
            self._client.ensure_path(self._paths.epoch)
            self._client.ensure_path(self._paths.checkpoint)
            while True:
                _, stat = self._client.get(self._paths.epoch)
                body = json.dumps({"writer": self._writer, "at_ms": int(time.time() * 1000)})
                try:
                    new = self._client.set(self._paths.epoch, body.encode(), version=stat.version)
                except BadVersionError:
                    continue  # another candidate raced us; read again
                self.epoch = int(new.version)
                return self.epoch
        except zk_errors() as exc:
            raise CoordinationError(f"cannot claim an epoch: {exc!r}") from None

    def load(self) -> Checkpoint | None:
        """Read the checkpoint and remember its version for the next conditional write."""
        try:
            data, stat = self._client.get(self._paths.checkpoint)
        except NoNodeError:
            self._version = -1
            return None
        except zk_errors() as exc:
            raise CoordinationError(f"cannot read the checkpoint: {exc!r}") from None
        self._version = int(stat.version)
        return Checkpoint.decode(data, stat.version) if data else None

    def write(self, time_ms: int, offsets: Mapping[int, int]) -> Checkpoint:
        """Write ``(time_ms, offsets)`` under this replica's epoch.

        Raises FencedError when a newer epoch exists or the checkpoint changed under us, and
        CoordinationError when ZooKeeper cannot be reached (the outcome is then unknown).
        """
        if self.epoch is None:
            raise FencedError(f"{self._writer} holds no epoch")
        cp = Checkpoint(time_ms, dict(offsets), self.epoch, self._writer, int(time.time() * 1000))
        txn = self._client.transaction()
        txn.check(self._paths.epoch, self.epoch)
        txn.set_data(self._paths.checkpoint, cp.encode(), version=self._version)
        try:
            results = txn.commit()
        except zk_errors() as exc:
            raise CoordinationError(f"checkpoint write failed: {exc!r}") from None
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            real = [r for r in failures if not isinstance(r, RolledBackError)]
            raise FencedError(
                f"checkpoint write by {self._writer} at epoch {self.epoch} rejected: "
                f"{type(real[0]).__name__ if real else 'rolled back'}"
            )
        self._version = int(results[1].version)
        return Checkpoint(
            cp.time_ms, cp.offsets, cp.epoch, cp.writer, cp.written_at_ms, self._version
        )
