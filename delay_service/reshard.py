"""``kdelay reshard --shards M``: change a stopped delay set's shard count (docs/operations.md).

The procedure: stop every replica (a graceful stop writes a last checkpoint; in exactly-once
mode every release's tombstone was committed with it), run ``kdelay reshard --shards M``, start
the replicas with ``--shards M``. Nothing is lost or released twice:

- **Refused while anything runs.** Every replica of the old and the new layout registers in
  ZooKeeper; if any status node or election candidate exists, nothing is changed and the error
  names them.
- **A checkpoint per new shard, derived from the old ones.** The new shard ``j``'s claim is
  ``(T, O)`` with ``O[p]`` the old checkpoint's offset of each partition ``p`` it now owns and
  ``T`` the *earliest* of the old shards' times: it covers only what some old checkpoint
  covered (so nothing pending is dropped), and what the old masters released after ``T`` is
  removed from the new stores by its tombstones, read with the rest of the topic. It is written
  under a newly claimed epoch of the new shard's root, so it outranks an older master's
  checkpoint there (in ZooKeeper, and in ``__kdelay_checkpoint``, where the higher epoch wins).
- **The layout last.** Only then is ``<root>/layout`` changed; replicas started with another
  ``--shards`` refuse to run. A replica whose store holds another shard rebuilds it from the
  buffer topic before it joins its shard's election (``shard_dir.py``).

Changing the buffer topic's partition count is a different step (docs/operations.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from kdelay import logs
from kdelay.checkpoint import CheckpointRecord
from kdelay.errors import ConfigError
from kdelay.shards import owns
from zk import CheckpointStore, Paths, read_checkpoint
from zk.layout import Layout, read_layout, write_layout

log = logs.get(__name__)

WRITER = "kdelay-reshard"


@dataclass(frozen=True, slots=True)
class ReshardResult:
    """What ``kdelay reshard`` did: the layouts and the checkpoint written per new shard."""

    old: int
    new: int
    checkpoints: dict[str, CheckpointRecord]  # by the new shard's root


def running(client: KazooClient, roots: list[Paths]) -> list[str]:
    """The replicas registered or standing for election under any of ``roots``."""
    found: list[str] = []
    for paths in roots:
        for parent, what in ((paths.replicas, "registered"), (paths.election, "candidate")):
            try:
                children = client.get_children(parent)
            except NoNodeError:
                continue
            found += [f"{paths.root}: {child} ({what})" for child in sorted(children)]
    return found


def derive(
    old: dict[int, CheckpointRecord | None], old_shards: int, shard: int, shards: int
) -> tuple[int, dict[int, int]]:
    """The claim ``(T, O)`` of new shard ``shard`` of ``shards`` from the old shards'
    checkpoints (module docstring); ``T`` is -1 when no old shard had one."""
    records = [r for r in old.values() if r is not None]
    time_ms = min((r.time_ms for r in records), default=-1)
    offsets: dict[int, int] = {}
    for i, record in old.items():
        if record is None:
            continue
        for partition, offset in record.offsets.items():
            if owns(partition, shard, shards) and owns(partition, i, old_shards):
                offsets[partition] = offset
    return time_ms, offsets


def reshard(client: KazooClient, root: Paths, shards: int) -> ReshardResult:
    """Change the delay set under ``root`` to ``shards`` shards (module docstring)."""
    layout = read_layout(client, root)
    old_shards = 1 if layout is None else layout.shards
    if shards == old_shards:
        if layout is None:
            write_layout(client, root, Layout(shards))
        return ReshardResult(old_shards, shards, {})
    old_roots = [root.shard(i, old_shards) for i in range(old_shards)]
    new_roots = [root.shard(j, shards) for j in range(shards)]
    roots = {p.root: p for p in [*old_roots, *new_roots]}  # shard-0 may be in both
    busy = running(client, list(roots.values()))
    if busy:
        raise ConfigError(
            "shards: stop every replica of the delay set before resharding; still there: "
            + "; ".join(busy)
        )
    old: dict[int, CheckpointRecord | None] = {}
    for i, paths in enumerate(old_roots):
        data = read_checkpoint(client, paths)
        old[i] = CheckpointRecord.decode(data) if data else None
    written: dict[str, CheckpointRecord] = {}
    for j, paths in enumerate(new_roots):
        time_ms, offsets = derive(old, old_shards, j, shards)
        store = CheckpointStore(client, paths, WRITER)
        epoch = store.claim_epoch()
        store.load()
        record = CheckpointRecord(time_ms, offsets, epoch, WRITER, int(time.time() * 1000))
        store.write(record.encode())
        written[paths.root] = record
        log.info(
            "reshard.checkpoint_written",
            root=paths.root,
            time_ms=time_ms,
            offsets=offsets,
            epoch=epoch,
        )
    write_layout(client, root, Layout(shards))
    log.info("reshard.layout_written", root=root.root, old=old_shards, new=shards)
    return ReshardResult(old_shards, shards, written)
