"""A short fixed-seed randomized fault run: ``python -m bench.chaos`` for
90 s against a local stack (one broker, three replicas, the proxy), a fault every ~20 s, judged
by bench/chaos/checker.py. It must find no violation, and the faults must have happened: at
least four, of at least three kinds, each undone without error.

Seed 5 deals follower-kill, zk-restart, proxy-stop and follower-stop (bench/chaos/plan.py); the
operations' interleaving with the processes differs from run to run, which is the point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEED = 5


def test_a_short_chaos_run_violates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    argv = [sys.executable, "-m", "bench.chaos", "--minutes", "1.5", "--seed", str(SEED)]
    argv += ["--fault-every", "20", "--json", str(out), "--work", str(tmp_path / "work")]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=480, check=False)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    result = json.loads(out.read_text())
    assert not any(result["violations"].values()), tail
    faults = result["faults"]
    assert len(faults) >= 4, faults
    assert len({f["kind"] for f in faults}) >= 3, faults
    assert [f for f in faults if f["error"]] == [], faults
    assert sum(result["operations"].values()) > 100, result["operations"]
    assert result["crashes"] == [], result["crashes"]
