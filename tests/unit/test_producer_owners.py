"""One principal per producer id (proxy/kafka/idempotence.py, "One principal per producer id")."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import kafka.errors as kerr
import pytest

from kdelay.proxy.kafka.idempotence import Check, ProducerRegistry, Verdict

ALICE, BOB = "User:alice", "User:bob"
UNKNOWN_PRODUCER_ID = kerr.UnknownProducerIdError.errno


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def _batch(
    reg: ProducerRegistry,
    loop: asyncio.AbstractEventLoop,
    pid: int,
    *,
    epoch: int,
    seq: int,
    owner: str | None,
) -> Check:
    return reg.check(pid, epoch, "t", 0, base_seq=seq, last_seq=seq, loop=loop, owner=owner)


def test_another_principals_batch_on_a_handed_out_id_is_refused_and_changes_nothing(
    loop: asyncio.AbstractEventLoop,
) -> None:
    reg = ProducerRegistry(first_id=7)
    pid, epoch = reg.init_producer(owner=ALICE)
    assert _batch(reg, loop, pid, epoch=epoch, seq=0, owner=ALICE).verdict is Verdict.ACCEPT
    for bobs_epoch, seq in ((epoch, 1), (epoch + 1, 0), (epoch + 100, 5)):
        stolen = _batch(reg, loop, pid, epoch=bobs_epoch, seq=seq, owner=BOB)
        assert stolen.verdict is Verdict.REJECT
        assert stolen.error is not None
        assert stolen.error.error_code == UNKNOWN_PRODUCER_ID
    # Her sequence and epoch are where she left them.
    assert _batch(reg, loop, pid, epoch=epoch, seq=1, owner=ALICE).verdict is Verdict.ACCEPT


def test_init_producer_id_bumps_only_the_owners_epoch() -> None:
    reg = ProducerRegistry(first_id=7)
    pid, epoch = reg.init_producer(owner=ALICE)
    other, other_epoch = reg.init_producer(pid, epoch, owner=BOB)
    assert other != pid
    assert other_epoch == 0
    assert reg.init_producer(pid, epoch, owner=ALICE) == (pid, epoch + 1)


def test_an_adopted_id_is_a_producer_of_its_own_for_each_principal(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """After a restart bob presents alice's id first: neither refuses nor swallows the other."""
    reg = ProducerRegistry(first_id=1)
    pid = 424242  # not handed out by this registry
    assert _batch(reg, loop, pid, epoch=0, seq=2, owner=BOB).verdict is Verdict.ACCEPT
    mine = _batch(reg, loop, pid, epoch=0, seq=2, owner=ALICE)
    assert mine.verdict is Verdict.ACCEPT, "alice's batch was taken for bob's duplicate"
    assert _batch(reg, loop, pid, epoch=0, seq=3, owner=ALICE).verdict is Verdict.ACCEPT
    assert (
        _batch(reg, loop, pid, epoch=5, seq=0, owner=BOB).verdict is Verdict.ACCEPT
    )  # bob's own epoch
    assert _batch(reg, loop, pid, epoch=0, seq=4, owner=ALICE).verdict is Verdict.ACCEPT
    # Her epoch bump (InitProducerId with her id) is hers alone, and bob's his.
    assert reg.init_producer(pid, 0, owner=ALICE) == (pid, 1)
    assert reg.init_producer(pid, 5, owner=BOB) == (pid, 6)


def test_an_evicted_id_forgets_its_principal(loop: asyncio.AbstractEventLoop) -> None:
    now = [0.0]
    reg = ProducerRegistry(first_id=1, ttl_s=60, clock=lambda: now[0])
    pid, epoch = reg.init_producer(owner=ALICE)
    now[0] = 61.0
    # Forgotten: like any id this process did not hand out, adopted per principal.
    assert _batch(reg, loop, pid, epoch=epoch, seq=0, owner=BOB).verdict is Verdict.ACCEPT
    assert _batch(reg, loop, pid, epoch=epoch, seq=0, owner=ALICE).verdict is Verdict.ACCEPT


def test_without_sasl_nothing_changes(loop: asyncio.AbstractEventLoop) -> None:
    reg = ProducerRegistry(first_id=1)
    pid, epoch = reg.init_producer()
    assert _batch(reg, loop, pid, epoch=epoch, seq=0, owner=None).verdict is Verdict.ACCEPT
    assert _batch(reg, loop, pid, epoch=epoch, seq=0, owner=None).verdict is Verdict.DUPLICATE
    assert reg.init_producer(pid, epoch) == (pid, epoch + 1)


def test_ids_are_random_not_consecutive() -> None:
    reg = ProducerRegistry()
    ids = [reg.init_producer(owner=ALICE)[0] for _ in range(20)]
    assert len(set(ids)) == 20
    assert all(0 < pid <= 2**46 for pid in ids)
    # Consecutive ids by chance: about 20 in 2**45.
    assert not any(abs(a - b) == 1 for a, b in itertools.pairwise(ids))
