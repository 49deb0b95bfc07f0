"""The master's checkpoints as a follower applies them: each one only once it has settled.

A follower learns each checkpoint from ZooKeeper (a watch, every ``checkpoint_interval_ms``)
at about the moment the master's tombstones for the same releases become readable in the
buffer topic: the transaction that commits them is what the checkpoint follows. Applied at
once, a checkpoint usually reaches the follower's store first, so the follower removed the
released entries twice over: by the checkpoint (decoding each entry, writing a "covered"
outcome) and again by each tombstone (an index miss, then the outcome the tombstone tells).
In a three-replica run that was as much of a follower's CPU as ingesting the records.

So a follower applies a checkpoint only once it has been known for ``settle_s``: by then the
tombstones have normally removed what it covers, and applying it costs a seek. It still drops
what no tombstone removed (a master that died between its checkpoint and its tombstones), and
it still lets a follower that is catching up skip the schedules it covers, a little later. A
replica that becomes master applies the newest checkpoint itself (forwarder.py), so nothing
here delays a takeover.

Not thread-safe: the replica's control thread is its only user.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from kdelay.checkpoint import Checkpoint

#: How long a follower holds a checkpoint before applying it: well above the time the master's
#: tombstones take to reach a follower that keeps up (its ingest lingers 50 ms).
SETTLE_S = 1.0


class FollowerCheckpoints:
    """Checkpoints in the order seen; :meth:`settled` hands out those old enough, once."""

    def __init__(
        self, settle_s: float = SETTLE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settle_s = settle_s
        self._clock = clock
        self._seen: deque[tuple[float, int, Checkpoint]] = deque()
        self._newest_version = -1

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, version: int, checkpoint: Checkpoint) -> None:
        """A checkpoint read from ZooKeeper with its znode ``version``; one not newer than
        the newest seen is ignored (a watch can deliver the same version twice)."""
        if version <= self._newest_version:
            return
        self._newest_version = version
        self._seen.append((self._clock(), version, checkpoint))

    def settled(self) -> list[tuple[int, Checkpoint]]:
        """``(version, checkpoint)`` of each checkpoint seen at least ``settle_s`` ago and not
        handed out before, oldest first: applied in order, as they were written."""
        cutoff = self._clock() - self._settle_s
        out: list[tuple[int, Checkpoint]] = []
        while self._seen and self._seen[0][0] <= cutoff:
            _, version, checkpoint = self._seen.popleft()
            out.append((version, checkpoint))
        return out

    def clear(self) -> None:
        """Forget what has not settled (this replica became master: it applies the newest
        checkpoint itself)."""
        self._seen.clear()
