"""`kdelay up` is safe to kill and to run twice (issue "Safe by default").

- SIGKILL of `kdelay up` (no hook runs) takes ZooKeeper, Kafka, the proxy and the replicas with
  it: each child was started with the parent-death signal.
- A second `kdelay up` on the same data directory fails at once, naming the running one, and
  leaves its state file and processes alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from dev.stack.process import ManagedProcess, python_argv, wait_until
from tests.support.up import children_of, kdelay_up


def test_a_second_up_on_the_same_data_dir_leaves_the_first_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    workdir = tmp_path_factory.mktemp("up-twice")
    with kdelay_up(workdir, "--replicas", "1") as up:
        before = up.state_file.read_text()
        children = {m.pid for m in children_of(up.process.pid)}
        second = subprocess.run(
            python_argv(
                "up", "--data-dir", str(workdir / "data"), "--state-file", str(up.state_file)
            ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert second.returncode == 2, second.stderr
        assert f"another kdelay up (pid {up.process.pid})" in second.stderr
        assert str((workdir / "data").resolve()) in second.stderr
        # Nothing of the running stack was touched.
        assert up.state_file.read_text() == before
        assert {m.pid for m in children_of(up.process.pid)} == children
        assert up.process.alive()
    assert up.exit_code == 0, up.process.log_tail()


def test_sigkill_of_up_takes_every_child_with_it(tmp_path: Path) -> None:
    state_file = tmp_path / "up.json"
    argv = python_argv(
        "up",
        "--replicas",
        "2",
        "--data-dir",
        str(tmp_path / "data"),
        "--state-file",
        str(state_file),
    )
    up = ManagedProcess("kdelay-up", argv, tmp_path / "up.log")
    up.start()
    try:
        wait_until(
            lambda: state_file.exists() and "kdelay ready" in up.log_tail(),
            timeout=300,
            what="`kdelay up` to print 'kdelay ready'",
            proc=up,
            interval=0.2,
        )
        state = json.loads(state_file.read_text())
        children = children_of(up.pid)
        kinds = {
            "zookeeper": "ZooKeeperServerMain",
            "kafka": "kafka.Kafka",
            "proxy": "-m kdelay proxy",
            "replica": "-m kdelay delay-service",
        }
        for kind, marker in kinds.items():
            assert any(marker in m.cmdline for m in children), (kind, children)
        assert {r["pid"] for r in state["replicas"]} <= {m.pid for m in children}
        os.kill(up.pid, signal.SIGKILL)  # no atexit, no signal handler: only the kernel acts
        wait_until(
            lambda: children_of(up.pid) == [],
            timeout=10,
            what="every child of the SIGKILLed `kdelay up` to die",
            interval=0.1,
        )
    finally:
        up.stop(grace=5)
        for m in children_of(up.pid):  # only if the assertion above failed
            os.killpg(m.pid, signal.SIGKILL)
