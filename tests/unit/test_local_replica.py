"""One command line for a delay-service replica (dev/stack/replica.py)."""

from __future__ import annotations

from pathlib import Path

from dev.stack.replica import ReplicaSpec


def test_only_given_settings_become_flags_and_extra_args_come_last() -> None:
    spec = ReplicaSpec(
        "r1",
        "k:9092",
        "z:2181",
        Path("/d"),
        zk_session_timeout=3.0,
        metrics_port=9400,
        extra_args=("--metrics-port", "0"),
    )
    assert spec.args() == [
        "delay-service",
        "--name", "r1",
        "--bootstrap-servers", "k:9092",
        "--zk-connect", "z:2181",
        "--data-dir", "/d",
        "--zk-session-timeout", "3.0",
        "--metrics-port", "9400",
        "--metrics-port", "0",
    ]  # fmt: skip
