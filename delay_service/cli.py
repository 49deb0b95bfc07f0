"""``kdelay delay-service`` (run one replica), ``kdelay status`` (CONTRACT.md), whose
``--id ID`` asks the replicas about one message (docs/status.md), and ``kdelay list``, the
pending messages in due order as the replicas list them (``GET /v1/messages?state=pending``),
following each page's ``next`` up to ``--limit``. ``kdelay reshard`` is reshard/cli.py.

``kdelay status``, ``kdelay list`` and ``kdelay reshard`` log in to ZooKeeper as the replicas
do (zk_flags.py): ``--zk-auth-username``, ``--zk-auth-password-file``, ``--zk-tls`` and
``--zk-tls-ca-file``, each also read from the replicas' own variable
(``KDELAY_REPLICA_ZK_AUTH_USERNAME`` ...), so they run unchanged beside a replica. The password
is never a flag: ``KDELAY_ZK_AUTH_PASSWORD`` (else the replicas'
``KDELAY_REPLICA_ZK_AUTH_PASSWORD``) or the password file.
"""

from __future__ import annotations

import json
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kdelay import logs, memory
from kdelay.config_loader import load
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.zk_flags import check_access, no_auth, zk_security, zk_security_options
from kdelay.options import config_options
from kdelay.stop_signals import on_stop_signals
from kdelay.zk.paths import DEFAULT_ROOT
from kdelay.zk.security import ZkSecurity

if TYPE_CHECKING:
    pass

#: Most messages one listing page holds (GET /v1/messages, CONTRACT.md v3).
LIST_PAGE_MAX = 1000


@click.command("delay-service")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="JSON/YAML file")
@config_options(ReplicaConfig)
def command(config_file: Path | None, **flags: Any) -> None:
    """Run one delay-service replica until SIGTERM/SIGINT."""
    cfg = load(ReplicaConfig, flags, config_file)
    logs.configure(cfg.log_level)
    memory.limit_arenas()  # before any thread starts (kdelay/memory.py)
    from kdelay.delay_service.replica import Replica

    replica = Replica(cfg)

    def on_signal(signum: int) -> None:
        logs.get(__name__).info("replica.signal_received", signal=signal.Signals(signum).name)
        replica.request_stop()

    on_stop_signals(on_signal)
    memory.freeze_startup_objects()  # no full collection walks them again (kdelay/memory.py)
    memory.collect_young_less_often()
    replica.run()


@click.command("status")
@click.option("--zk-connect", envvar="KDELAY_REPLICA_ZK_CONNECT", default="127.0.0.1:2181")
@click.option("--zk-root", envvar="KDELAY_REPLICA_ZK_ROOT", default=DEFAULT_ROOT)
@zk_security_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option(
    "--timeout",
    type=float,
    default=10.0,
    help="seconds to wait for ZooKeeper (with --id, for the replicas too)",
)
@click.option(
    "--id",
    "msg_id",
    help="show this message's status instead (as GET /v1/messages/{id} does); exit 1 when "
    "no replica knows it",
)
def status_command(
    zk_connect: str,
    zk_root: str,
    as_json: bool,
    timeout: float,
    msg_id: str | None,
    **security_flags: Any,
) -> None:
    """Master, replicas with their lag and pending count, and the checkpoint; or, with
    --id, one message's status."""
    from kdelay.zk import Paths, Session
    from kdelay.zk.errors import no_auth_error
    from kdelay.zk.layout import delay_set_status

    security = zk_security(**security_flags)
    try:
        paths = Paths(zk_root)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--zk-root") from None
    if msg_id is not None:
        _message_status(
            zk_connect, zk_root, msg_id, as_json=as_json, timeout=timeout, security=security
        )
        return
    session = Session(zk_connect, timeout, security=security)
    session.start(timeout=timeout)
    try:
        check_access(session.client, zk_root, security)
        status = delay_set_status(session.client, paths)
    except no_auth_error():
        raise no_auth(zk_root, security) from None
    finally:
        session.stop()
    if as_json:
        click.echo(json.dumps(status, sort_keys=True))
        return
    sharded = len(status["shards"]) > 1
    for shard in status["shards"]:
        _print_shard(shard, sharded=sharded)
    sys.stdout.flush()


def _print_shard(shard: dict[str, Any], *, sharded: bool) -> None:
    """One replica set's lines of ``kdelay status`` (headed by its shard when there are more)."""
    indent = ""
    if sharded:
        click.echo(f"shard {shard['shard']} ({shard['root']}):")
        indent = "  "
    click.echo(f"{indent}master: {shard['master'] or '(none)'}")
    rows = [("NAME", "ROLE", "LAG", "PENDING", "METRICS")]
    for r in shard["replicas"]:
        rows.append(
            (r["name"], r["role"], str(r["lag"]), str(r["pending"]), str(r.get("metrics", "")))
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        click.echo(f"{indent}{cells}".rstrip())
    cp = shard["checkpoint"]
    if cp:
        click.echo(
            f"{indent}checkpoint: time_ms={cp['time_ms']} epoch={cp['epoch']} "
            f"writer={cp['writer']} offsets={json.dumps(cp['offsets'], sort_keys=True)}"
        )
    else:
        click.echo(f"{indent}checkpoint: (none)")


def _message_status(
    zk_connect: str,
    zk_root: str,
    msg_id: str,
    *,
    as_json: bool,
    timeout: float,
    security: ZkSecurity,
) -> None:
    """``kdelay status --id``: ask the replicas (zk/replica_api.py), print the answer."""
    from kdelay.zk.replica_api import NoReplicaError, ReplicaApi

    api = ReplicaApi(zk_connect, zk_root, timeout_s=timeout, security=security)
    try:
        answer = api.message(msg_id)
    except NoReplicaError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        api.close()
    body = answer.body
    if answer.status != 200:
        error = {"error": body.get("error", f"HTTP {answer.status}"), "field": "id"}
        if as_json:
            click.echo(json.dumps(error, sort_keys=True))
        else:
            click.echo(f"kdelay: {error['error']}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(body, sort_keys=True))
        return
    for label, value in _describe(body):
        click.echo(f"{label + ':':<13}{value}")


def _when(ms: object) -> str:
    """An epoch-milliseconds time, readable (UTC) and exact."""
    if not isinstance(ms, int):
        return "(unknown)"
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return f"{moment.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} ({ms})"


def _describe(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The lines of a message status for people (the JSON has every field)."""
    partition = doc.get("partition")
    target = f"{doc.get('topic')}, partition {'by key' if partition is None else partition}"
    if doc.get("offset") is not None:
        target += f", offset {doc['offset']}"
    rows = [
        ("id", str(doc.get("id"))),
        ("state", str(doc.get("state"))),
        ("deliver at", _when(doc.get("deliver_at"))),
        ("target", target),
    ]
    if doc.get("repeat") is not None or doc.get("occurrence") is not None:
        rows.append(("occurrence", f"{doc.get('occurrence')} of {doc.get('repeat') or 'a series'}"))
    for field, label in (("released_at", "released at"), ("cancelled_at", "cancelled at")):
        if field in doc:
            rows.append((label, _when(doc[field])))
    last = doc.get("last_outcome")
    if isinstance(last, dict):
        at = last.get("released_at", last.get("cancelled_at"))
        rows.append(("before", f"{last.get('state')} at {_when(at)}"))
    for i, event in enumerate(doc.get("history") or []):
        rows.append(("history" if i == 0 else "", _event_line(event)))
    lag = doc.get("ingest_lag")
    rows.append(
        (
            "answered by",
            f"{doc.get('answered_by')} ({doc.get('role')}) as of {_when(doc.get('as_of_ms'))}, "
            f"ingest lag {'unknown' if lag is None else f'{lag} records'}",
        )
    )
    return rows


def _event_line(event: dict[str, Any]) -> str:
    """One event of a message's history (delay_service/queries/message_status.py), on one line."""
    kind = str(event.get("event"))
    line = f"{kind.replace('_', '-')} at {_when(event.get('at'))}"
    if event.get("occurrence") is not None:
        line = f"occurrence {event['occurrence']}: {line}"
    by = event.get("by")
    if isinstance(by, dict):
        line += " by " + ("an administrator" if by.get("admin") else str(by.get("principal")))
    elif by is not None:
        line += f" by {by}"
    if event.get("lateness_ms") is not None:
        line += f", {event['lateness_ms']} ms after its due time"
    if event.get("reason"):
        line += f": {event['reason']}"
    return line


@click.command("list")
@click.option("--zk-connect", envvar="KDELAY_REPLICA_ZK_CONNECT", default="127.0.0.1:2181")
@click.option("--zk-root", envvar="KDELAY_REPLICA_ZK_ROOT", default=DEFAULT_ROOT)
@zk_security_options
@click.option("--topic", help="only the messages for this target topic")
@click.option("--id-prefix", help="only the messages whose id starts with this")
@click.option("--due-before", help="only the messages due before: epoch ms or RFC 3339")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="most messages to print (pages of up to 1000 are followed to reach it)",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@click.option(
    "--timeout", type=float, default=30.0, help="seconds to wait for ZooKeeper and each page"
)
def list_command(
    *,
    zk_connect: str,
    zk_root: str,
    topic: str | None,
    id_prefix: str | None,
    due_before: str | None,
    limit: int,
    as_json: bool,
    timeout: float,
    **security_flags: Any,
) -> None:
    """The pending messages in due order, as GET /v1/messages?state=pending lists them,
    asking the replicas found through ZooKeeper (every principal's messages)."""
    from kdelay.zk.replica_api import NoReplicaError, ReplicaApi

    security = zk_security(**security_flags)
    params = _list_params(topic, id_prefix, due_before)
    api = ReplicaApi(zk_connect, zk_root, timeout_s=timeout, security=security)
    shown = 0
    rows: list[tuple[str, str, str, str]] = [("ID", "DELIVER AT", "TOPIC", "PARTITION")]
    try:
        while shown < limit:
            answer = api.list_pending(params, min(LIST_PAGE_MAX, limit - shown))
            body = answer.body
            if answer.status != 200:
                raise click.ClickException(str(body.get("error", f"HTTP {answer.status}")))
            for msg in body["messages"]:
                shown += 1
                if as_json:
                    doc = {
                        k: msg.get(k) for k in ("id", "state", "deliver_at", "topic", "partition")
                    }
                    click.echo(json.dumps(doc, sort_keys=True))
                else:
                    rows.append(_list_row(msg))
            if not body.get("next"):
                break
            params["cursor"] = str(body["next"])
    except NoReplicaError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        api.close()
    if not as_json:
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _list_params(
    topic: str | None, id_prefix: str | None, due_before: str | None
) -> dict[str, str]:
    """The replicas' listing parameters of ``kdelay list``'s filters."""
    from kdelay.listing import listing_filters

    try:
        return listing_filters(topic, id_prefix, due_before)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--due-before") from None


def _list_row(msg: dict[str, Any]) -> tuple[str, str, str, str]:
    """A listed message's row of ``kdelay list``'s table."""
    partition = msg.get("partition")
    return (
        str(msg["id"]),
        _when(msg.get("deliver_at")),
        str(msg.get("topic")),
        "by key" if partition is None else str(partition),
    )
