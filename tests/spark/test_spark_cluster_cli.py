"""``kdelay spark up`` as a user runs it: a subprocess in the foreground, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dev.spark import SparkCluster
from dev.stack.process import KDELAY
from kdelay.errors import InfrastructureError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_spark_up_prints_ready_writes_its_state_and_sigterm_stops_every_process(
    tmp_path: Path,
) -> None:
    start = time.monotonic()
    state_file = tmp_path / "spark.json"
    argv = [KDELAY, "spark", "up", "--workers", "2", "--state-file", str(state_file)]
    argv += ["--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (or the process exits: "")
        assert line.startswith("spark ready spark://127.0.0.1:"), line
        state = json.loads(state_file.read_text())
        assert set(state) == {"spark_master", "spark_ui", "workers"}
        assert line.split()[-1] == state["spark_master"]
        assert state_file.stat().st_mode & 0o777 == 0o644
        assert [set(w) for w in state["workers"]] == [{"pid", "ui"}] * 2
        url = f"{state['spark_ui']}/json/"  # http://127.0.0.1:port
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
            master = json.loads(resp.read())
        assert master["status"] == "ALIVE"
        assert master["aliveworkers"] == 2
        assert master["url"] == state["spark_master"]
        pids = [w["pid"] for w in state["workers"]]
        assert all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert "spark stopped" in err
    assert not state_file.exists()
    assert not [p for p in pids if _alive(p)]
    # The master is gone too: nothing answers on its web UI.
    with pytest.raises(urllib.error.URLError, match="refused"):
        urllib.request.urlopen(url, timeout=5)  # noqa: S310
    print(f"\nspark up/stop: {time.monotonic() - start:.1f} s")


def test_a_worker_that_exits_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    start = time.monotonic()
    cluster = SparkCluster(tmp_path, workers=1, worker_memory="lots")  # not a memory size
    try:
        with pytest.raises(InfrastructureError, match=r"Spark worker 0 exited .*worker-0\.log"):
            cluster.start()
    finally:
        cluster.stop()
    assert cluster.master is not None
    assert not cluster.master.alive()
    print(f"\nworker exit: {time.monotonic() - start:.1f} s")
