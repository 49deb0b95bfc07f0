"""Which shard a replica's data directory holds: ``<data_dir>/shard.json``.

A store holds the entries, offsets and open cancels of its shard's buffer partitions only. When a
replica starts with another shard, shard count or buffer topic than its store was built for (it
was moved to another shard, or the set was resharded), the store is removed and rebuilt from the
buffer topic, as an empty disk is: the replica joins the election only once caught up. A store
from before shards (no ``shard.json``) belongs to shard 0 of 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kdelay import logs
from kdelay.delay_service.config import ReplicaConfig

log = logs.get(__name__)

SHARD_FILE = "shard.json"
STORE_DIR = "store"


def _identity(cfg: ReplicaConfig) -> dict[str, object]:
    return {"shard": cfg.shard, "shards": cfg.shards, "buffer_topic": cfg.buffer_topic}


def prepare(cfg: ReplicaConfig) -> bool:
    """Make ``cfg.data_dir`` hold ``cfg``'s shard; True when a store of another was removed."""
    path = cfg.data_dir / SHARD_FILE
    store = cfg.data_dir / STORE_DIR
    wanted = _identity(cfg)
    found: dict[str, object] | None
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except ValueError:
            found = None
    elif store.exists():
        found = {"shard": 0, "shards": 1, "buffer_topic": cfg.buffer_topic}
    else:
        found = wanted
    rebuilt = False
    if found != wanted and store.exists():
        log.warning("replica.store_rebuilt", found=found, wanted=wanted, store=str(store))
        shutil.rmtree(store)
        rebuilt = True
    _write(path, wanted)
    return rebuilt


def _write(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True) + "\n")
    tmp.replace(path)
