"""``kdelay up``: the embedded stack in the foreground until SIGINT or SIGTERM (CONTRACT.md).

Like the orchestrator it stands in for, it restarts a replica or the proxy that exits (see
:mod:`dev.stack.restarts`) and stops on its own only when the local Kafka or ZooKeeper
cannot be kept running.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import click

from dev.stack.restarts import ComponentLostError, SupervisedProcesses
from dev.stack.stack import LocalStack, StackOptions
from kdelay.stop_signals import on_stop_signals


def _echo(line: str) -> None:
    click.echo(line, err=True)


@click.command("up")
@click.option(
    "--replicas", type=click.IntRange(1, 9), default=3, help="delay-service replicas per shard"
)
@click.option(
    "--shards",
    type=click.IntRange(1, 16),
    default=1,
    help="shards dividing the buffer partitions (at most --buffer-partitions), each a replica "
    "set of --replicas",
)
@click.option(
    "--proxy-port", type=click.IntRange(0, 65535), default=0, help="Kafka listener (0: free)"
)
@click.option(
    "--proxy-workers",
    type=click.IntRange(1, 64),
    default=1,
    help="proxy processes on the proxy's ports (kdelay proxy --workers)",
)
@click.option("--http-port", type=click.IntRange(0, 65535), default=0, help="HTTP API (0: free)")
@click.option(
    "--kafka-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="local Kafka's client listener, with --secure its SASL_SSL one (0: free)",
)
@click.option(
    "--zk-port", type=click.IntRange(0, 65535), default=0, help="local ZooKeeper (0: free)"
)
@click.option("--bootstrap-servers", default=None, help="use this Kafka instead of a local one")
@click.option("--zk-connect", default=None, help="use this ZooKeeper instead of a local one")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path(".kdelay/data"))
@click.option("--state-file", type=click.Path(path_type=Path), default=Path(".kdelay/up.json"))
@click.option("--buffer-partitions", type=click.IntRange(1, 1024), default=6)
@click.option(
    "--secure",
    is_flag=True,
    help="Kafka on SASL_SSL (SCRAM-SHA-512, ACLs), ZooKeeper with ACLs, the proxy on SASL_SSL "
    'and HTTPS with authentication; the state file\'s "security" gives the CA and the Kafka '
    "super user (README, Security)",
)
def command(**options: Any) -> None:
    """Start ZooKeeper, Kafka, the proxy and N replicas per shard; print `kdelay ready`; keep
    them running (a child that exits is restarted with back-off) until SIGINT or SIGTERM."""
    if options["shards"] > options["buffer_partitions"]:
        raise click.BadParameter(
            f"{options['shards']} shards need at least as many buffer partitions "
            f"(--buffer-partitions is {options['buffer_partitions']})",
            param_hint="--shards",
        )
    opts = StackOptions(**options)
    stack = LocalStack(opts, progress=_echo)
    stop = threading.Event()
    on_stop_signals(lambda _signum: stop.set())
    lost: ComponentLostError | None = None
    try:
        stack.start()
        if not stop.is_set():
            _echo(f"    proxy {stack.state()['proxy']}  http {stack.state()['http']}")
            if stack.secure is not None:
                _echo(f"    secured: SASL_SSL, CA {stack.ca_file}, admin user in {opts.state_file}")
            _echo(f"    kafka {stack.bootstrap}  zookeeper {stack.zk_connect}")
            _echo(f"    logs in {opts.data_dir.resolve()}, state in {opts.state_file}")
            click.echo("kdelay ready", err=False)
            sys.stdout.flush()
        supervisor = SupervisedProcesses(
            stack.components(), log=_echo, on_restart=lambda _c: stack.write_state()
        )
        while not stop.wait(1.0):
            try:
                supervisor.tick()
            except ComponentLostError as exc:
                lost = exc
                break
    finally:
        stack.stop()
    if lost is not None:
        _echo(f"kdelay: error: {lost}")
        sys.exit(1)
    _echo("kdelay stopped")
