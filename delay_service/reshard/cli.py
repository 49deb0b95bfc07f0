"""``kdelay reshard --shards M``: the command line of delay_service/reshard/reshard.py (the
procedure is in its docstring and docs/operations.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from kdelay.config_loader import load
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.zk_flags import check_access, no_auth, zk_security, zk_security_options
from kdelay.zk.paths import DEFAULT_ROOT


@click.command("reshard")
@click.option("--zk-connect", envvar="KDELAY_REPLICA_ZK_CONNECT", default="127.0.0.1:2181")
@click.option("--zk-root", envvar="KDELAY_REPLICA_ZK_ROOT", default=DEFAULT_ROOT)
@click.option(
    "--shards", type=click.IntRange(1, 1024), required=True, help="the new number of shards"
)
@click.option("--timeout", type=float, default=10.0, help="seconds to wait for ZooKeeper")
@click.option(
    "--bootstrap-servers",
    envvar="KDELAY_REPLICA_BOOTSTRAP_SERVERS",
    default=None,
    help="Kafka, to fence the transactional ids of the shards a smaller layout removes (its "
    "login: the replicas' KDELAY_REPLICA_KAFKA_* settings); without it they are not fenced",
)
@click.option(
    "--buffer-topic",
    envvar="KDELAY_REPLICA_BUFFER_TOPIC",
    default="__kdelay_buffer",
    show_default=True,
    help="the delay set's buffer topic (part of its transactional ids)",
)
@zk_security_options
def reshard_command(
    *,
    zk_connect: str,
    zk_root: str,
    shards: int,
    timeout: float,
    bootstrap_servers: str | None,
    buffer_topic: str,
    **security_flags: Any,
) -> None:
    """Change the shard count of a delay set whose replicas are all stopped; then start them
    with the new --shards (docs/operations.md, "Shards")."""
    from kdelay.delay_service.reshard.reshard import fence, reshard
    from kdelay.zk import Paths, Session
    from kdelay.zk.errors import no_auth_error

    security = zk_security(**security_flags)
    fence_removed: Callable[[list[str]], None] | None = None
    if bootstrap_servers:
        kafka = load(ReplicaConfig, {"bootstrap_servers": bootstrap_servers}).kafka_connection(
            bootstrap_servers
        )

        def fence_removed_shards(removed: list[str]) -> None:
            fence(removed, buffer_topic, kafka, timeout)

        fence_removed = fence_removed_shards

    try:
        paths = Paths(zk_root)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--zk-root") from None
    # It writes the tree as a replica does: an open one is closed first (zk/acls.py).
    session = Session(zk_connect, timeout, security=security, close_root=zk_root)
    session.start(timeout=timeout)
    try:
        check_access(session.client, zk_root, security)
        result = reshard(session.client, paths, shards, fence_removed)
    except no_auth_error():
        raise no_auth(zk_root, security) from None
    finally:
        session.stop()
    if result.old == result.new:
        click.echo(f"{zk_root} has {shards} shard(s) already: nothing changed")
        return
    click.echo(f"{zk_root}: {result.old} -> {result.new} shard(s)")
    for root, record in result.checkpoints.items():
        offsets = json.dumps({str(p): o for p, o in sorted(record.offsets.items())})
        click.echo(f"  {root}: checkpoint time_ms={record.time_ms} offsets={offsets}")
    if result.removed:
        state = "fenced" if bootstrap_servers else "NOT fenced (no --bootstrap-servers)"
        click.echo(f"  removed shards' transactional ids {state}: {', '.join(result.removed)}")
    click.echo(f"start the replicas with --shards {shards} (--shard 0..{shards - 1})")
