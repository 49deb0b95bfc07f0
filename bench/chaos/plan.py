"""The seeded schedule of a chaos run: which operations, on which ids, when; which faults, when.

One ``random.Random(seed)`` draws everything, before the run starts, so the same seed gives the
same operations and the same faults (the interleaving with real processes differs from run to
run). A *scenario* is one id's life (or one record without an id): its steps run one after the
other, each sent ``after_s`` seconds after the previous one was answered.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

#: The fault kinds the nemesis knows (bench/chaos/faults.py).
FAULT_KINDS = (
    "master-kill",
    "follower-kill",
    "master-stop",
    "follower-stop",
    "proxy-kill",
    "proxy-stop",
    "zk-restart",
    "store-wipe",
    "clock-offset",
    "reshard",
    "broker-kill",
    "broker-clock-offset",
)
#: The kinds that need a 3-broker Kafka (one broker down or restarted at a time).
BROKER_KINDS = frozenset({"broker-kill", "broker-clock-offset"})
#: A process's clock offset: a few hundred ms either way, well inside what kdelay tolerates
#: (``--max-clock-skew-ms``, 10 s); a broker's up to 300 ms either way.
CLOCK_OFFSET_MS = (100, 500)
BROKER_OFFSET_MS = (50, 300)
#: Delay levels 1..3 of the default table: 1 s, 5 s, 10 s.
LEVEL_MS = {1: 1_000, 2: 5_000, 3: 10_000}


@dataclass(frozen=True)
class Step:
    """One operation. ``timing``: ``delay_ms`` / ``deliver_at`` (``value_ms`` from the send) /
    ``level``; ``repeat``: (count, period s) of a series."""

    kind: str
    after_s: float = 0.0
    timing: str = "delay_ms"
    value_ms: int = 0
    repeat: tuple[int, int] | None = None


@dataclass(frozen=True)
class Scenario:
    start_s: float
    worker: int
    msg_id: str  # "" for a record sent without an id
    topic: int  # index of the target topic
    steps: tuple[Step, ...]
    #: A bulk cancel's group: the ids scheduled under one prefix (msg_id is the prefix).
    group: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fault:
    kind: str
    at_s: float
    duration_s: float
    #: A clock kind's offset (either sign); 0 for the others.
    offset_ms: int = 0


@dataclass(frozen=True)
class Plan:
    scenarios: tuple[Scenario, ...]
    faults: tuple[Fault, ...]

    def operations(self) -> dict[str, int]:
        """Counts by kind (a bulk scenario's schedules count once per id)."""
        counts: Counter[str] = Counter()
        for sc in self.scenarios:
            for step in sc.steps:
                counts[step.kind] += 1
        return dict(sorted(counts.items()))


def _timing(rng: random.Random, lo_ms: int, hi_ms: int) -> tuple[str, int]:
    how = rng.choices(("delay_ms", "deliver_at", "level"), (6, 3, 1))[0]
    if how == "level":
        level = rng.choice([lv for lv, ms in LEVEL_MS.items() if ms <= hi_ms] or [1])
        return how, level
    return how, rng.randrange(lo_ms, hi_ms + 1)


def _cancel(rng: random.Random, after_s: float) -> Step:
    kind = rng.choice(("cancel_header", "cancel_http", "cancel_confirmed", "cancel_confirmed"))
    return Step(kind, after_s)


def _delayed(rng: random.Random) -> list[Step]:
    how, value = _timing(rng, 1_000, 15_000)
    due_s = (LEVEL_MS[value] if how == "level" else value) / 1000
    steps = [Step(rng.choice(("delayed_header", "delayed_http")), 0.0, how, value)]
    if rng.random() < 0.3:
        steps.append(Step("status", rng.uniform(0.1, 1.0)))
    roll = rng.random()
    if roll < 0.25:
        steps.append(_cancel(rng, rng.uniform(0.0, due_s * 0.9)))
    elif roll < 0.5:
        how2, value2 = _timing(rng, 1_000, 12_000)
        kind = rng.choice(("replace_header", "replace_http"))
        steps.append(Step(kind, rng.uniform(0.0, due_s * 0.9), how2, value2))
        if rng.random() < 0.25:
            steps.append(_cancel(rng, rng.uniform(0.0, 3.0)))
    elif roll < 0.6:  # a cancel or replace that may race the release
        steps.append(_cancel(rng, due_s + rng.uniform(-0.5, 0.5)))
    if rng.random() < 0.2:
        steps.append(Step("status", rng.uniform(0.0, 2.0)))
    return steps


def _series(rng: random.Random) -> list[Step]:
    count, period = rng.choice(((3, 2), (2, 3), (4, 1)))
    how, value = _timing(rng, 500, 6_000)
    steps = [Step("series_header", 0.0, how, value, (count, period))]
    if rng.random() < 0.3:
        due_s = (LEVEL_MS[value] if how == "level" else value) / 1000
        steps.append(_cancel(rng, due_s + rng.uniform(0.5, period * (count - 1))))
    return steps


def _replace_series(rng: random.Random) -> list[Step]:
    """A pending message replaced by a series: every occurrence is due."""
    first = Step("delayed_http", 0.0, "delay_ms", rng.randrange(6_000, 15_000))
    count, period = rng.choice(((3, 1), (5, 1), (3, 2)))
    replace = Step("replace_series_http", rng.uniform(0.2, 3.0), "delay_ms", 500, (count, period))
    return [first, replace]


def _scenario(rng: random.Random, start_s: float, worker: int, n: int, seed: int) -> Scenario:
    msg_id = f"c{seed}-{n}"
    topic = rng.randrange(2)
    kind = rng.choices(
        ("immediate", "noid", "delayed", "series", "replace_series", "bulk", "list"),
        (10, 10, 45, 15, 8, 6, 6),
    )[0]
    if kind == "immediate":
        return Scenario(start_s, worker, "", topic, (Step("immediate"),))
    if kind == "noid":
        how, value = _timing(rng, 500, 12_000)
        return Scenario(start_s, worker, "", topic, (Step("delayed_noid", 0.0, how, value),))
    if kind == "list":
        return Scenario(start_s, worker, "", topic, (Step("list"),))
    if kind == "bulk":
        size = rng.randrange(2, 5)
        group = tuple(f"{msg_id}-b{i}" for i in range(size))
        steps = [Step("delayed_header", 0.0, "delay_ms", rng.randrange(8_000, 15_000))] * size
        bulk = rng.choice(("bulk_cancel", "bulk_cancel_confirmed"))
        return Scenario(start_s, worker, msg_id, topic, (*steps, Step(bulk, 1.0)), group)
    build = {"delayed": _delayed, "series": _series, "replace_series": _replace_series}[kind]
    return Scenario(start_s, worker, msg_id, topic, tuple(build(rng)))


def make_plan(
    seed: int, seconds: float, *, rate: float, workers: int, fault_every: float, brokers: int
) -> Plan:
    """Scenarios starting at ``rate`` a second (Poisson) for ``seconds``, round-robin over
    ``workers``; a fault every ``fault_every`` s (± a quarter), kinds dealt from shuffled decks
    so every kind comes before any repeats."""
    rng = random.Random(seed)
    scenarios: list[Scenario] = []
    t = 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        n = len(scenarios)
        scenarios.append(_scenario(rng, t, n % workers, n, seed))
    kinds = [k for k in FAULT_KINDS if k not in BROKER_KINDS or brokers >= 3]
    faults: list[Fault] = []
    deck: list[str] = []
    for k in range(1, int(seconds // fault_every) + 1):
        at = k * fault_every + rng.uniform(-0.25, 0.25) * fault_every
        if at > seconds - 5:
            break
        if not deck:
            deck = rng.sample(kinds, len(kinds))
        kind = deck.pop()
        duration = round(rng.uniform(2.0, 10.0), 1)
        faults.append(Fault(kind, round(at, 1), duration, _offset_ms(rng, kind)))
    return Plan(tuple(scenarios), tuple(faults))


def _offset_ms(rng: random.Random, kind: str) -> int:
    if kind not in ("clock-offset", "broker-clock-offset"):
        return 0
    lo, hi = CLOCK_OFFSET_MS if kind == "clock-offset" else BROKER_OFFSET_MS
    return rng.choice((-1, 1)) * rng.randrange(lo, hi + 1)
