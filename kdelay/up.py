"""``kdelay up``: the embedded stack in the foreground until SIGINT or SIGTERM (CONTRACT.md)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from kdelay.local.stack import LocalStack, StackOptions


def _echo(line: str) -> None:
    click.echo(line, err=True)


@click.command("up")
@click.option("--replicas", type=click.IntRange(1, 9), default=3, help="delay-service replicas")
@click.option(
    "--proxy-port", type=click.IntRange(0, 65535), default=0, help="Kafka listener (0: free)"
)
@click.option("--http-port", type=click.IntRange(0, 65535), default=0, help="HTTP API (0: free)")
@click.option(
    "--kafka-port", type=click.IntRange(0, 65535), default=0, help="local Kafka (0: free)"
)
@click.option(
    "--zk-port", type=click.IntRange(0, 65535), default=0, help="local ZooKeeper (0: free)"
)
@click.option("--bootstrap-servers", default=None, help="use this Kafka instead of a local one")
@click.option("--zk-connect", default=None, help="use this ZooKeeper instead of a local one")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".kdelay/data"))
@click.option("--state-file", type=click.Path(path_type=Path), default=Path(".kdelay/up.json"))
@click.option("--buffer-partitions", type=click.IntRange(1, 1024), default=6)
def command(**options: Any) -> None:
    """Start ZooKeeper, Kafka, the proxy and N replicas; print `kdelay ready`; stop on a signal."""
    opts = StackOptions(**options)
    stack = LocalStack(opts, progress=_echo)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        stack.start()
        if not stop.is_set():
            _echo(f"    proxy {stack.state()['proxy']}  http {stack.state()['http']}")
            _echo(f"    kafka {stack.bootstrap}  zookeeper {stack.zk_connect}")
            _echo(f"    logs in {opts.data_dir.resolve()}, state in {opts.state_file}")
            click.echo("kdelay ready", err=False)
            sys.stdout.flush()
        while not stop.wait(1.0):
            dead = stack.dead_components()
            if dead:
                _echo(f"kdelay: error: {', '.join(dead)} exited; see the logs in {opts.data_dir}")
                break
    finally:
        stack.stop()
    if received or not stack.dead_components():
        _echo("kdelay stopped")
        return
    sys.exit(1)
