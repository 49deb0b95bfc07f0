"""``kdelay reshard --shards M``: change a stopped delay set's shard count (docs/operations.md).

The procedure: stop every replica (a graceful stop writes a last checkpoint; in exactly-once
mode every release's tombstone was committed with it), run ``kdelay reshard --shards M``, start
the replicas with ``--shards M``. Nothing is lost or released twice:

- **Refused while anything runs.** Every replica of the old and the new layout registers in
  ZooKeeper; if any status node or election candidate exists, nothing is changed and the error
  names them.
- **A checkpoint per new shard, derived from the old ones.** The new shard ``j``'s claim is
  ``(T, O)`` with ``O[p]`` the old checkpoint's offset of each partition ``p`` it now owns and
  ``T`` the *earliest* time of the old checkpoints it takes offsets from: it covers only what
  some old checkpoint covered (so nothing pending is dropped), and what the old masters
  released after ``T`` is removed from the new stores by its tombstones, read with the rest of
  the topic. An old shard whose partitions the new one does not own does not lower ``T``: at
  least once, a release whose tombstone was lost would otherwise be released again. It is written
  under a newly claimed epoch of the new shard's root, so it outranks an older master's
  checkpoint there (in ZooKeeper, and in ``__kdelay_checkpoint``, where the higher epoch wins).
- **Removed shards fenced.** Given Kafka (``--bootstrap-servers``), the transactional id of
  every old shard the new layout does not keep (3 -> 2 drops ``shard-2``'s; any change to or
  from one shard drops the others') is initialised once: Kafka bumps its epoch, so a frozen old
  master of that shard can no longer commit a release. Without Kafka it is only logged.
- **The layout last.** Only then is ``<root>/layout`` changed; replicas started with another
  ``--shards`` refuse to run. A replica whose store holds another shard rebuilds it from the
  buffer topic before it joins its shard's election (``shard_dir.py``).

Changing the buffer topic's partition count is a different step (docs/operations.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kdelay import logs
from kdelay.checkpoint import CheckpointRecord
from kdelay.delay_service.release.txn_sender import release_transactional_id
from kdelay.errors import ConfigError, InfrastructureError
from kdelay.shards import owns
from kdelay.zk import CheckpointStore, Paths, read_checkpoint
from kdelay.zk.access import ZkClient, children
from kdelay.zk.layout import Layout, read_layout, write_layout

log = logs.get(__name__)

WRITER = "kdelay-reshard"


@dataclass(frozen=True, slots=True)
class ReshardResult:
    """What ``kdelay reshard`` did: the layouts and the checkpoint written per new shard."""

    old: int
    new: int
    checkpoints: dict[str, CheckpointRecord]  # by the new shard's root
    removed: tuple[str, ...] = ()  # the old shards' roots the new layout does not keep


def fence(
    removed: list[str], buffer_topic: str, client_config: dict[str, str], timeout: float
) -> None:
    """Initialise the transactional id of each removed shard root (the one its masters used,
    ``delay_service/release/txn_sender.py``): Kafka aborts what it left open and fences its
    producer. InfrastructureError naming the id when Kafka refuses or does not answer."""
    from confluent_kafka import KafkaException, Producer

    for root in removed:
        txn_id = release_transactional_id(root, buffer_topic)
        producer = Producer({**client_config, "transactional.id": txn_id})
        try:
            producer.init_transactions(timeout)
        except KafkaException as exc:
            raise InfrastructureError(
                f"reshard: could not fence transactional id {txn_id!r} of removed shard "
                f"{root}: {exc.args[0]}"
            ) from None
        finally:
            producer.flush(0)
        log.info("reshard.fenced", root=root, transactional_id=txn_id)


def running(client: ZkClient, roots: list[Paths]) -> list[str]:
    """The replicas registered or standing for election under any of ``roots``."""
    found: list[str] = []
    for paths in roots:
        for parent, what in ((paths.replicas, "registered"), (paths.election, "candidate")):
            found += [
                f"{paths.root}: {child} ({what})"
                for child in sorted(children(client, parent) or [])
            ]
    return found


def derive(
    old: dict[int, CheckpointRecord | None], old_shards: int, shard: int, shards: int
) -> tuple[int, dict[int, int]]:
    """The claim ``(T, O)`` of new shard ``shard`` of ``shards`` from the old shards'
    checkpoints (module docstring); ``T`` is -1 when no old shard had one."""
    offsets: dict[int, int] = {}
    sources: list[int] = []  # the times of the old checkpoints this claim takes offsets from
    for i, record in old.items():
        if record is None:
            continue
        mine = {
            partition: offset
            for partition, offset in record.offsets.items()
            if owns(partition, shard, shards) and owns(partition, i, old_shards)
        }
        if mine:
            offsets.update(mine)
            sources.append(record.time_ms)
    if not sources:  # nothing claimed: the time covers nothing without offsets
        sources = [r.time_ms for r in old.values() if r is not None]
    return min(sources, default=-1), offsets


def reshard(
    client: ZkClient,
    root: Paths,
    shards: int,
    fence_removed: Callable[[list[str]], None] | None = None,
) -> ReshardResult:
    """Change the delay set under ``root`` to ``shards`` shards (module docstring);
    ``fence_removed`` (e.g. :func:`fence` with the Kafka settings) gets the removed shards'
    roots before the layout changes."""
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
    kept = {p.root for p in new_roots}
    removed = [p.root for p in old_roots if p.root not in kept]
    if removed and fence_removed is not None:
        fence_removed(removed)
    elif removed:
        log.warning(
            "reshard.not_fenced",
            removed=removed,
            why="no --bootstrap-servers: a frozen old master of these shards could still commit",
        )
    write_layout(client, root, Layout(shards))
    log.info("reshard.layout_written", root=root.root, old=old_shards, new=shards)
    return ReshardResult(old_shards, shards, written, tuple(removed))
