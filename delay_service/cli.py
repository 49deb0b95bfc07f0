"""``kdelay delay-service`` (run one replica) and ``kdelay status`` (CONTRACT.md)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import click

from delay_service.config import ReplicaConfig
from kdelay import logs, memory
from kdelay.config import load
from kdelay.options import config_options
from zk.paths import DEFAULT_ROOT


@click.command("delay-service")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="JSON/YAML file")
@config_options(ReplicaConfig)
def command(config_file: Path | None, **flags: Any) -> None:
    """Run one delay-service replica until SIGTERM/SIGINT."""
    cfg = load(ReplicaConfig, flags, config_file)
    logs.configure(cfg.log_level)
    memory.limit_arenas()  # before any thread starts (kdelay/memory.py)
    from delay_service.replica import Replica

    replica = Replica(cfg)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logs.get(__name__).info("replica.signal_received", signal=signal.Signals(signum).name)
        replica.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    replica.run()


@click.command("status")
@click.option("--zk-connect", envvar="KDELAY_REPLICA_ZK_CONNECT", default="127.0.0.1:2181")
@click.option("--zk-root", envvar="KDELAY_REPLICA_ZK_ROOT", default=DEFAULT_ROOT)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--timeout", type=float, default=10.0, help="seconds to wait for ZooKeeper")
def status_command(zk_connect: str, zk_root: str, as_json: bool, timeout: float) -> None:
    """Master, replicas with their lag and pending count, and the checkpoint."""
    from zk import Paths, Session, cluster_status

    try:
        paths = Paths(zk_root)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--zk-root") from None
    session = Session(zk_connect, timeout)
    session.start(timeout=timeout)
    try:
        status = cluster_status(session.client, paths)
    finally:
        session.stop()
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    click.echo(f"master: {status['master'] or '(none)'}")
    rows = [("NAME", "ROLE", "LAG", "PENDING", "METRICS")]
    for r in status["replicas"]:
        rows.append(
            (r["name"], r["role"], str(r["lag"]), str(r["pending"]), str(r.get("metrics", "")))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    cp = status["checkpoint"]
    if cp:
        click.echo(
            f"checkpoint: time_ms={cp['time_ms']} epoch={cp['epoch']} writer={cp['writer']} "
            f"offsets={json.dumps(cp['offsets'], sort_keys=True)}"
        )
    else:
        click.echo("checkpoint: (none)")
    sys.stdout.flush()
