"""Shards (kdelay/shards.py, zk/layout.py, delay_service/reshard/reshard.py, shard_dir.py): which
shard owns a partition, each shard's znodes, the layout document, the checkpoint a reshard derives
for each new shard, and a data directory moved to another shard."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdelay.checkpoint import Checkpoint, CheckpointRecord
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.reshard import shard_dir
from kdelay.delay_service.reshard.reshard import derive
from kdelay.shards import owned, owns, shard_of
from kdelay.zk import CoordinationError, Paths
from kdelay.zk.layout import Layout


def test_every_partition_has_exactly_one_shard() -> None:
    for shards in (1, 2, 3, 5):
        for p in range(24):
            assert [s for s in range(shards) if owns(p, s, shards)] == [shard_of(p, shards)]
    assert owned(range(7), 1, 3) == [1, 4]
    assert owned([5, 0, 3], 0, 1) == [0, 3, 5]


def test_one_shard_keeps_the_root_and_more_get_their_own() -> None:
    root = Paths("/kdelay/prod")
    assert root.shard(0, 1) == root
    assert root.shard(2, 3).root == "/kdelay/prod/shard-2"
    assert root.shard(2, 3).checkpoint == "/kdelay/prod/shard-2/checkpoint"
    assert root.layout == "/kdelay/prod/layout"


def test_the_layout_document() -> None:
    assert Layout.decode(Layout(4).encode(), "x") == Layout(4)
    for bad in (b"{}", b"[]", b'{"shards": 0}', b'{"shards": "2"}', b"nope"):
        with pytest.raises(CoordinationError, match="/k/layout"):
            Layout.decode(bad, "/k/layout")


def record(time_ms: int, offsets: dict[int, int]) -> CheckpointRecord:
    return CheckpointRecord(time_ms, offsets, 3, "m", 0)


def test_a_reshard_claims_only_what_some_old_checkpoint_covered() -> None:
    # 2 shards of 6 partitions -> 3 shards.
    old: dict[int, CheckpointRecord | None] = {
        0: record(1_000, {0: 10, 2: 20, 4: 40}),
        1: record(900, {1: 11, 3: 31, 5: 51}),
    }
    claims = [derive(old, 2, j, 3) for j in range(3)]
    assert claims == [
        (900, {0: 10, 3: 31}),
        (900, {1: 11, 4: 40}),
        (900, {2: 20, 5: 51}),
    ]
    # Whatever a derived claim covers, the old shard's own checkpoint covered.
    for j, (time_ms, offsets) in enumerate(claims):
        new = Checkpoint(time_ms, offsets)
        for p in offsets:
            before = old[p % 2]
            assert before is not None
            mine = Checkpoint(before.time_ms, before.offsets)
            for offset in range(60):
                for due in (800, 900, 950, 1_000, 1_100):
                    if new.covers(p, offset, due):
                        assert mine.covers(p, offset, due), (j, p, offset, due)


def test_a_reshard_takes_its_time_only_from_the_old_shards_it_takes_partitions_from() -> None:
    # 2 shards of 8 partitions -> 4: new shards 0 and 2 hold only old shard 0's partitions.
    old: dict[int, CheckpointRecord | None] = {
        0: record(1_000, {p: p for p in range(0, 8, 2)}),
        1: record(900, {p: p for p in range(1, 8, 2)}),
    }
    claims = [derive(old, 2, j, 4) for j in range(4)]
    assert [t for t, _ in claims] == [1_000, 900, 1_000, 900]
    assert [sorted(o) for _, o in claims] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_a_reshard_without_old_checkpoints_claims_nothing() -> None:
    assert derive({0: None}, 1, 0, 2) == (-1, {})
    # An old shard without a checkpoint contributes no offsets (its partitions stay unclaimed).
    assert derive({0: record(5, {0: 1}), 1: None}, 2, 0, 1) == (5, {0: 1})


def config(tmp_path: Path, shard: int, shards: int) -> ReplicaConfig:
    return ReplicaConfig(name="r", data_dir=tmp_path, shard=shard, shards=shards)


def test_a_store_of_another_shard_is_rebuilt(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert not shard_dir.prepare(config(tmp_path, 0, 1))  # a new directory
    store.mkdir()
    (store / "data").write_text("x")
    assert not shard_dir.prepare(config(tmp_path, 0, 1))  # same shard: kept
    assert (store / "data").exists()
    assert shard_dir.prepare(config(tmp_path, 1, 2))  # moved: removed, rebuilt from the topic
    assert not store.exists()


def test_a_store_from_before_shards_belongs_to_shard_0_of_1(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    assert not shard_dir.prepare(config(tmp_path, 0, 1))
    assert (tmp_path / "store").exists()
    assert shard_dir.prepare(config(tmp_path, 0, 2))


def test_a_shard_outside_the_layout_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"must be in 0\.\.1 with 2 shard"):
        config(tmp_path, 2, 2)
