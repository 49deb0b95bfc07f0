"""``kdelay delay-service`` (run one replica), ``kdelay status`` (CONTRACT.md), whose
``--id ID`` asks the replicas about one message (docs/status.md), and ``kdelay list``, the
pending messages in due order as the replicas list them (``GET /v1/messages?state=pending``),
following each page's ``next`` up to ``--limit``.

``kdelay status``, ``kdelay list`` and ``kdelay reshard`` log in to ZooKeeper as the replicas
do (zk/security.py): ``--zk-auth-username``, ``--zk-auth-password-file``, ``--zk-tls`` and
``--zk-tls-ca-file``, each also read from the replicas' own variable
(``KDELAY_REPLICA_ZK_AUTH_USERNAME`` ...), so they run unchanged beside a replica. The password
is never a flag: ``KDELAY_ZK_AUTH_PASSWORD`` (else the replicas'
``KDELAY_REPLICA_ZK_AUTH_PASSWORD``) or the password file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from pydantic import SecretStr, ValidationError

from delay_service.config import ReplicaConfig
from kdelay import logs, memory
from kdelay.config_loader import load
from kdelay.options import config_options
from kdelay.stop_signals import on_stop_signals
from zk.paths import DEFAULT_ROOT
from zk.security import ZkSecurity

if TYPE_CHECKING:
    from kazoo.client import KazooClient

F = TypeVar("F", bound=Callable[..., Any])

#: Most messages one listing page holds (GET /v1/messages, CONTRACT.md v3).
LIST_PAGE_MAX = 1000
#: Where ``kdelay status`` and ``kdelay reshard`` read the ZooKeeper password, first found wins.
PASSWORD_ENV = ("KDELAY_ZK_AUTH_PASSWORD", "KDELAY_REPLICA_ZK_AUTH_PASSWORD")


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

    def on_signal(signum: int) -> None:
        logs.get(__name__).info("replica.signal_received", signal=signal.Signals(signum).name)
        replica.request_stop()

    on_stop_signals(on_signal)
    memory.freeze_startup_objects()  # no full collection walks them again (kdelay/memory.py)
    memory.collect_young_less_often()
    replica.run()


def zk_security_options(func: F) -> F:
    """The ZooKeeper login and TLS flags of ``kdelay status`` and ``kdelay reshard``."""
    options = [
        click.option(
            "--zk-auth-username",
            envvar="KDELAY_REPLICA_ZK_AUTH_USERNAME",
            help="ZooKeeper digest user (the replicas' zk_auth_username); its password from "
            f"{' or '.join(PASSWORD_ENV)}, or --zk-auth-password-file",
        ),
        click.option(
            "--zk-auth-password-file",
            envvar="KDELAY_REPLICA_ZK_AUTH_PASSWORD_FILE",
            type=click.Path(path_type=Path),
            help="file holding that user's password",
        ),
        click.option(
            "--zk-tls/--no-zk-tls",
            envvar="KDELAY_REPLICA_ZK_TLS",
            default=False,
            help="connect to ZooKeeper over TLS",
        ),
        click.option(
            "--zk-tls-ca-file",
            envvar="KDELAY_REPLICA_ZK_TLS_CA_FILE",
            type=click.Path(path_type=Path),
            help="PEM CA bundle that signed ZooKeeper's certificate [the system's CAs]",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def zk_security(
    zk_auth_username: str | None,
    zk_auth_password_file: Path | None,
    zk_tls: bool,
    zk_tls_ca_file: Path | None,
) -> ZkSecurity:
    """The ZooKeeper settings of a command's flags and the password's environment; a usage
    error naming the setting when they do not fit together (never the password)."""
    password = next((os.environ[n] for n in PASSWORD_ENV if os.environ.get(n)), None)
    try:
        return ZkSecurity(
            zk_auth_username=zk_auth_username,
            zk_auth_password=None if password is None else SecretStr(password),
            zk_auth_password_file=zk_auth_password_file,
            zk_tls=zk_tls,
            zk_tls_ca_file=zk_tls_ca_file,
        )
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise click.UsageError(f"ZooKeeper security: {why}") from None


def _check_access(client: KazooClient, zk_root: str, security: ZkSecurity) -> None:
    """Fail with what to give when ZooKeeper will not let this session read ``zk_root`` (a
    root not created yet is not an error here)."""
    from kazoo.exceptions import NoAuthError, NoNodeError

    try:
        client.get_children(zk_root)
    except NoNodeError:
        pass
    except NoAuthError:
        raise _no_auth(zk_root, security) from None


def _no_auth(zk_root: str, security: ZkSecurity) -> click.ClickException:
    """ZooKeeper said NoAuth: name what to give."""
    if security.zk_auth_username is None:
        hint = (
            "its znodes are closed to anonymous clients: give the replicas' ZooKeeper user "
            f"(--zk-auth-username, the password in {PASSWORD_ENV[0]} or --zk-auth-password-file)"
        )
    else:
        hint = f"is the password of ZooKeeper user {security.zk_auth_username!r} right?"
    return click.ClickException(f"ZooKeeper refused access under {zk_root} (NoAuth): {hint}")


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
    from kazoo.exceptions import NoAuthError

    from zk import Paths, Session
    from zk.layout import delay_set_status

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
        _check_access(session.client, zk_root, security)
        status = delay_set_status(session.client, paths)
    except NoAuthError:
        raise _no_auth(zk_root, security) from None
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
    from zk.replica_api import NoReplicaError, ReplicaApi

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
    """One event of a message's history (delay_service/message_status.py), on one line."""
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
    from zk.replica_api import NoReplicaError, ReplicaApi

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
    from kazoo.exceptions import NoAuthError

    from delay_service.reshard import fence, reshard
    from zk import Paths, Session

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
        _check_access(session.client, zk_root, security)
        result = reshard(session.client, paths, shards, fence_removed)
    except NoAuthError:
        raise _no_auth(zk_root, security) from None
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
