"""The harness of the per-record CPU benches (``bench.forward_cpu``, ``ingest_cpu``, ``route_cpu``).

A bench module runs its measured code in a child process per *mode*: ``setup`` (the fixture
only), ``kdelay`` (this repository's code) and ``baseline`` (the least the same work needs
with the same libraries). Each child prints the measured part's CPU time per record; with
``--callgrind`` each runs under valgrind instead, and the figure is its instruction count
minus the setup's, per record. Instructions are deterministic to a fraction of a percent on a
shared 2-core VM, whose CPU times vary by a quarter from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kdelay import memory
from kdelay.delay_service.store.store import Store

MODES = ("setup", "kdelay", "baseline")


def report(run: Callable[[], int], records: int, mode: str) -> None:
    """In a child: time ``run`` (it returns the records it handled) and print the CPU µs a
    record; fails when it handled another number than ``records``."""
    started = time.thread_time()
    handled = run()
    elapsed = time.thread_time() - started
    if handled != records:
        raise SystemExit(f"{mode}: handled {handled} of {records}")
    print(json.dumps({"cpu_us_per_record": elapsed / records * 1e6}))


def in_store(
    mode: str,
    records: int,
    fill: Callable[[Store], None],
    kdelay: Callable[[Store], int],
    baseline: Callable[[Store], int],
) -> None:
    """In a child: a real store in a temporary directory, ``fill`` it, set a replica's
    collector (``kdelay.memory``), then :func:`report` on ``kdelay`` or ``baseline`` (the
    ``setup`` mode stops before)."""
    with tempfile.TemporaryDirectory(prefix="kdelay-cpu-count-") as tmp:
        store = Store(Path(tmp) / "db")
        try:
            fill(store)
            memory.freeze_startup_objects()
            memory.collect_young_less_often()
            if mode != "setup":
                run = kdelay if mode == "kdelay" else baseline
                report(lambda: run(store), records, mode)
        finally:
            store.close()


def _run(module: str, mode: str, records: int, *, callgrind: bool) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", module, "--child", mode, "--records", str(records)]
    if callgrind:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen(
        argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _instructions(proc: subprocess.Popen[str]) -> int:
    out, err = proc.communicate()
    found = re.search(r"I\s+refs:\s+([\d,]+)", err)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed ({proc.returncode}):\n{out}\n{err[-2000:]}")
    return int(found.group(1).replace(",", ""))


def _cpu_us(proc: subprocess.Popen[str]) -> float:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{out}\n{err[-2000:]}")
    return float(json.loads(out.strip().splitlines()[-1])["cpu_us_per_record"])


def main(
    module: str,
    doc: str,
    child: Callable[[str, int], None],
    argv: list[str] | None,
    *,
    what: str,
) -> dict[str, float]:
    """The command line of bench ``module``: ``--child MODE`` runs ``child(mode, records)``;
    otherwise the three modes are measured and the figures printed and returned. ``what``
    names a record's work in the progress line ("releases")."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--records", type=int, default=5_000, help="records handled per run")
    ap.add_argument("--repeat", type=int, default=5, help="CPU-time runs of each (median)")
    ap.add_argument("--callgrind", action="store_true", help="count instructions (valgrind)")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.records)
        return {}
    out: dict[str, float] = {"records": args.records}
    if args.callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
        print(f"counting instructions of {args.records:,} {what} under valgrind (~1 min)")
        procs = {m: _run(module, m, args.records, callgrind=True) for m in MODES}
        counts = {m: _instructions(p) for m, p in procs.items()}
        for mode in ("kdelay", "baseline"):
            out[f"{mode}_instructions_per_record"] = (counts[mode] - counts["setup"]) / args.records
        out["kdelay_vs_baseline"] = (
            out["kdelay_instructions_per_record"] / out["baseline_instructions_per_record"]
        )
    else:
        runs: dict[str, list[float]] = {"kdelay": [], "baseline": []}
        for i in range(args.repeat):
            print(f"run {i + 1}/{args.repeat}", flush=True)
            for mode, values in runs.items():  # alternating: a slow spell hits both
                values.append(_cpu_us(_run(module, mode, args.records, callgrind=False)))
        for mode, values in runs.items():
            out[f"{mode}_cpu_us_per_record"] = statistics.median(values)
        out["kdelay_vs_baseline"] = (
            out["kdelay_cpu_us_per_record"] / out["baseline_cpu_us_per_record"]
        )
    for k, v in out.items():
        print(f"{k:36} {v:,.2f}")
    print(json.dumps(out, indent=1))
    return out
