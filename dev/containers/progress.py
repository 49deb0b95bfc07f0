"""Progress lines and step timings for ``make containers`` and ``make demo-compose``.

Each step prints ``==> title`` when it starts and ``    <outcome> in N.N s`` when it ends; the
run's steps are appended, as one JSON line, to ``.kdelay/containers/timings.jsonl`` so cold and
warm runs can be compared afterwards.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path


def say(line: str) -> None:
    """One progress line, at once (make shows it as it happens)."""
    print(line, flush=True)  # noqa: T201 - progress for a person


@dataclass
class Step:
    """What a step did: ``outcome`` is printed after its duration (``built``, ``up to date``)."""

    outcome: str = "done"


@dataclass(frozen=True)
class Row:
    step: str
    seconds: float
    outcome: str


class Steps:
    """The steps of one run, timed."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.rows: list[Row] = []
        self._began = time.monotonic()

    @contextmanager
    def step(self, title: str) -> Iterator[Step]:
        say(f"==> {title}")
        step = Step()
        began = time.monotonic()
        try:
            yield step
        except BaseException:
            step.outcome = "FAILED"
            raise
        finally:
            took = time.monotonic() - began
            self.rows.append(Row(title, round(took, 1), step.outcome))
            say(f"    {step.outcome} in {took:.1f} s")

    def summary(self) -> str:
        width = max((len(r.step) for r in self.rows), default=10)
        lines = [f"{self.run}: step timings"]
        lines += [f"  {r.step:<{width}}  {r.seconds:7.1f} s  {r.outcome}" for r in self.rows]
        lines.append(f"  {'total':<{width}}  {time.monotonic() - self._began:7.1f} s")
        return "\n".join(lines)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "run": self.run,
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv[1:],
            "total_seconds": round(time.monotonic() - self._began, 1),
            "steps": [asdict(r) for r in self.rows],
        }
        with path.open("a") as out:
            out.write(json.dumps(record) + "\n")
