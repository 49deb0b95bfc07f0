"""The fenced checkpoint znode: opaque bytes that only the newest epoch holder may write.

Fencing: a master wins an *epoch* by bumping the epoch znode's version (a conditional set, so
two winners cannot get the same number). Every write is one ZooKeeper transaction
``check(epoch, version=my epoch) + set_data(checkpoint, bytes, version=last seen)``: once a newer
master has claimed its epoch, a deposed master's write fails with :class:`FencedError` and it
must stop forwarding at once.

What the bytes mean is the writer's business (``kdelay/checkpoint.py``); zk never reads them.

Thread-safety: a CheckpointStore is used by one thread at a time (the forwarder, or the control
thread before the forwarder starts); kazoo's client itself is thread-safe.
"""

from __future__ import annotations

import json
import time

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

from kdelay.zk.errors import CoordinationError, FencedError, zk_errors
from kdelay.zk.paths import Paths


def read_checkpoint(client: KazooClient, paths: Paths) -> bytes | None:
    """The checkpoint znode's bytes, or None when no master has written any yet."""
    try:
        data, _ = client.get(paths.checkpoint)
    except NoNodeError:
        return None
    return bytes(data) if data else None


class CheckpointStore:
    """Claims epochs and writes the fenced checkpoint bytes for one replica (``writer``)."""

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

    def load(self) -> bytes | None:
        """Read the checkpoint bytes and remember their version for the next conditional write."""
        try:
            data, stat = self._client.get(self._paths.checkpoint)
        except NoNodeError:
            self._version = -1
            return None
        except zk_errors() as exc:
            raise CoordinationError(f"cannot read the checkpoint: {exc!r}") from None
        self._version = int(stat.version)
        return bytes(data) if data else None

    def write(self, data: bytes) -> int:
        """Write ``data`` under this replica's epoch; returns the znode's new version.

        Raises FencedError when a newer epoch exists or the checkpoint changed under us, and
        CoordinationError when ZooKeeper cannot be reached (the outcome is then unknown).
        """
        if self.epoch is None:
            raise FencedError(f"{self._writer} holds no epoch")
        txn = self._client.transaction()
        txn.check(self._paths.epoch, self.epoch)
        txn.set_data(self._paths.checkpoint, data, version=self._version)
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
        return self._version
