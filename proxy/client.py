"""``kdelay send`` and ``kdelay cancel``: produce through the proxy with confluent-kafka.

``kdelay cancel --http URL`` cancels through the proxy's HTTP API instead; ``--wait S``
(confirmed cancel) and ``--prefix P`` (bulk cancel) need it: the answer, the master's decision
(proxy/http/cancel_wait.py), comes back on the same request. Exit status 0 only when cancelled.

Both log in to a SASL proxy listener like any Kafka client (:class:`ClientSecurity`): the
``--kafka-*`` flags, or ``KDELAY_KAFKA_*`` variables; the password only from
``KDELAY_KAFKA_SASL_PASSWORD`` or ``--kafka-sasl-password-file``, never a flag.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import click
from confluent_kafka import KafkaError, Message, Producer
from pydantic_settings import BaseSettings

from kdelay import buffer, durations
from kdelay import headers as h
from kdelay.config_loader import component_config, load
from kdelay.errors import InvalidHeaderError, KdelayError
from kdelay.kafka_security import KafkaClientSecurity
from kdelay.options import config_options


class ClientSecurity(BaseSettings, KafkaClientSecurity):
    """How ``kdelay send`` / ``cancel`` log in to the proxy: flags > ``KDELAY_KAFKA_*``."""

    model_config = component_config("KDELAY_")


def client_config(flags: dict[str, Any]) -> dict[str, str]:
    """librdkafka security settings from the ``--kafka-*`` flags and the environment."""
    return load(ClientSecurity, flags).kafka_client_config()


class SendError(KdelayError):
    """The proxy did not accept the record; the message carries its Kafka error."""


def produce_one(
    bootstrap: str,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    *,
    headers: list[tuple[str, str | bytes | None]],
    timeout: float = 30.0,
    config: dict[str, str] | None = None,
) -> Message:
    """Produce one record (idempotent, acks=all) and return its delivery report; ``config``
    adds librdkafka settings (the login)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            **(config or {}),
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    reports: list[tuple[KafkaError | None, Message]] = []
    producer.produce(
        topic,
        value,
        key,
        headers=headers,
        on_delivery=lambda err, msg: reports.append((err, msg)),
    )
    if producer.flush(timeout) or not reports:
        raise SendError(f"no acknowledgement from {bootstrap} within {timeout} s")
    err, msg = reports[0]
    if err is not None:
        raise SendError(f"{bootstrap} refused the record: {err.str()}")
    return msg


@click.command("send")
@click.option("--bootstrap-servers", required=True, help="the proxy's host:port")
@click.option("--topic", required=True)
@click.option("--key", default=None)
@click.option("--delay", default=None, help="delay, e.g. 1500ms, 30s, 5m, 2h")
@click.option("--at", "at", default=None, help="deliver at: epoch ms or RFC 3339")
@click.option("--level", type=click.IntRange(min=1), default=None, help="delay level 1..18")
@click.option("--id", "msg_id", default=None, help="message id (default: a new one)")
@click.option(
    "--replace",
    is_flag=True,
    help="replace what --id has pending (kdelay-replace: true); with nothing pending, schedule",
)
@click.option("--header", "extra", multiple=True, help="NAME=VALUE, repeatable")
@config_options(ClientSecurity)
@click.argument("value")
def send_command(
    *,
    bootstrap_servers: str,
    topic: str,
    key: str | None,
    delay: str | None,
    at: str | None,
    level: int | None,
    msg_id: str | None,
    replace: bool,
    extra: tuple[str, ...],
    value: str,
    **security: Any,
) -> None:
    """Send VALUE to TOPIC through the proxy, delayed unless no timing option is given."""
    login = client_config(security)
    chosen = [
        flag for flag, x in (("--delay", delay), ("--at", at), ("--level", level)) if x is not None
    ]
    if len(chosen) > 1:
        raise click.UsageError(
            f"give at most one of --delay, --at, --level (got {', '.join(chosen)})"
        )
    headers: list[tuple[str, str | bytes | None]] = []
    for item in extra:
        name, sep, val = item.partition("=")
        if not sep:
            raise click.UsageError(f"--header {item!r}: use NAME=VALUE")
        headers.append((name, val.encode()))
    if delay is not None:
        headers.append((h.DELAY_MS, str(parse_duration_ms(delay)).encode()))
    elif at is not None:
        try:
            h.parse_deliver_at(h.DELIVER_AT, at.encode())
        except InvalidHeaderError as exc:
            raise click.BadParameter(exc.problem, param_hint="--at") from None
        headers.append((h.DELIVER_AT, at.encode()))
    elif level is not None:
        headers.append((h.DELAY_LEVEL, str(level).encode()))
    delayed = bool(chosen)
    if replace and (msg_id is None or not delayed):
        raise click.UsageError("--replace needs --id and one of --delay, --at, --level")
    if delayed:
        msg_id = msg_id or h.new_id()
        try:
            h.validate_id(h.ID, msg_id.encode())
        except InvalidHeaderError as exc:
            raise click.BadParameter(exc.problem, param_hint="--id") from None
        headers.append((h.ID, msg_id.encode()))
    elif msg_id is not None:
        raise click.UsageError("--id needs one of --delay, --at, --level")
    if replace:
        headers.append((h.REPLACE, b"true"))
    raw_key = key.encode() if key is not None else None
    msg = produce_one(
        bootstrap_servers, topic, value.encode(), raw_key, headers=headers, config=login
    )
    click.echo(
        json.dumps(
            {
                "id": msg_id,
                "topic": topic,
                "partition": msg.partition(),
                "offset": msg.offset(),
                "delayed": delayed,
            }
        )
    )


#: Where ``kdelay up`` writes its state by default (CONTRACT.md): the HTTP API of a local stack.
UP_STATE_FILE = Path(".kdelay/up.json")


@click.command("cancel")
@click.option("--bootstrap-servers", default=None, help="the proxy's host:port (Kafka)")
@click.option(
    "--http",
    "http_url",
    default=None,
    envvar="KDELAY_HTTP",
    help="the proxy's HTTP API, e.g. http://127.0.0.1:8080: cancels over HTTP (Basic "
    "authentication with the --kafka-sasl-username and its password when given); needed by "
    '--wait and --prefix [$KDELAY_HTTP, else the "http" of kdelay up\'s state file '
    f"{UP_STATE_FILE}]",
)
@click.option(
    "--topic",
    default=None,
    help="over Kafka: the topic that carries the cancel, one you may WRITE, e.g. the "
    "message's own (with SASL the proxy checks WRITE on it) [__kdelay_buffer]; with --prefix: "
    "cancel only messages for this target topic",
)
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=None,
    help="wait up to this many seconds (at most 60) for the master's decision and print it; "
    "exit 0 only when cancelled (1: already delivered, unknown, not cancelled, or not decided "
    "in time)",
)
@click.option(
    "--prefix",
    default=None,
    help="bulk cancel: every pending message whose id starts with this (not empty), instead "
    "of MESSAGE_ID",
)
@config_options(ClientSecurity)
@click.argument("message_id", required=False)
def cancel_command(  # noqa: PLR0917 - click passes each option
    bootstrap_servers: str | None,
    http_url: str | None,
    topic: str | None,
    wait_s: float | None,
    prefix: str | None,
    message_id: str | None,
    **security: Any,
) -> None:
    """Cancel the pending message MESSAGE_ID (a no-op if it was already delivered), or with
    --prefix every pending message whose id starts with it."""
    login = load(ClientSecurity, security)
    if (message_id is None) == (prefix is None):
        raise click.UsageError("give MESSAGE_ID or --prefix, one of them")
    if http_url is None and (wait_s is not None or prefix is not None):
        http_url, ca_file = _from_up_state()
        if http_url is None:
            raise click.UsageError(
                "--wait and --prefix need --http (the proxy's HTTP API; or $KDELAY_HTTP, or "
                f"kdelay up's state file {UP_STATE_FILE})"
            )
        if ca_file is not None and login.kafka_ssl_ca_file is None:
            login = login.model_copy(update={"kafka_ssl_ca_file": ca_file})
    if http_url is not None:
        _cancel_over_http(http_url, login, message_id, prefix, topic, wait_s)
        return
    if bootstrap_servers is None:
        raise click.UsageError("give --bootstrap-servers (Kafka) or --http (the HTTP API)")
    assert message_id is not None
    try:
        h.validate_id(h.CANCEL, message_id.encode())
    except InvalidHeaderError as exc:
        raise click.BadParameter(exc.problem, param_hint="MESSAGE_ID") from None
    # The carrier topic is irrelevant to the cancel: the proxy turns the record into a
    # buffer-topic cancel. The buffer topic always exists, and it is the one internal topic the
    # proxy lets a cancel (and nothing else) be addressed to (proxy/routing/internal_topics.py); but
    # with SASL the proxy checks WRITE on the carrier, and WRITE on __kdelay_buffer would let
    # a principal write the buffer directly: --topic names one it may write anyway.
    carrier = topic or buffer.BUFFER_TOPIC
    produce_one(
        bootstrap_servers,
        carrier,
        b"",
        None,
        headers=[(h.CANCEL, message_id.encode())],
        config=login.kafka_client_config(),
    )
    click.echo(json.dumps({"id": message_id, "cancel": "accepted"}))


def _from_up_state() -> tuple[str | None, Path | None]:
    """The HTTP API and the CA (``kdelay up --secure``) named by kdelay up's state file in
    the current directory, if there is one."""
    try:
        state = json.loads(UP_STATE_FILE.read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(state, dict) or not isinstance(state.get("http"), str):
        return None, None
    security = state.get("security")
    ca = security.get("ca_file") if isinstance(security, dict) else None
    return state["http"], Path(ca) if isinstance(ca, str) else None


def _cancel_over_http(  # noqa: PLR0917 - the command's options
    url: str,
    login: ClientSecurity,
    message_id: str | None,
    prefix: str | None,
    topic: str | None,
    wait_s: float | None,
) -> None:
    """``DELETE /v1/messages/{id}`` or ``DELETE /v1/messages?id_prefix=..`` (with ``wait``);
    prints the answer's JSON; exits 1 unless it cancelled (module docstring of
    proxy/http/cancel_wait.py), 2 on an error answer."""
    query: dict[str, str] = {}
    if wait_s is not None:
        query["wait"] = f"{wait_s:g}"
    if prefix is not None:
        path = "/v1/messages"
        query["id_prefix"] = prefix
        if topic is not None:
            query["topic"] = topic
    else:
        assert message_id is not None
        path = "/v1/messages/" + urllib.parse.quote(message_id, safe="")
    target = url.rstrip("/") + path + ("?" + urllib.parse.urlencode(query) if query else "")
    status, body = http_delete(target, login)
    click.echo(json.dumps(body))
    if status == 200 or (status == 202 and wait_s is None):
        return
    if status in (202, 404, 409):
        raise SystemExit(1)
    raise click.ClickException(f"the proxy answered HTTP {status}: {body.get('error', body)}")


def http_delete(url: str, login: ClientSecurity) -> tuple[int, dict[str, Any]]:
    """DELETE ``url``: the HTTP status and JSON body. With ``kafka_sasl_username``, Basic
    authentication with it and its password (``KDELAY_KAFKA_SASL_PASSWORD`` or the file);
    ``kafka_ssl_ca_file`` verifies an HTTPS proxy."""
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url[:80]!r} is not an http(s) URL", param_hint="--http")
    request = urllib.request.Request(url, method="DELETE")  # noqa: S310 - http(s) only
    if login.kafka_sasl_username is not None:
        token = f"{login.kafka_sasl_username}:{login.kafka_password()}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    context = None
    if url.startswith("https:"):
        ca = login.kafka_ssl_ca_file
        context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    try:
        with urllib.request.urlopen(request, timeout=90, context=context) as resp:  # noqa: S310
            return resp.status, _json_body(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json_body(exc.read())
    except (urllib.error.URLError, OSError) as exc:
        raise click.ClickException(f"--http {url.split('?', maxsplit=1)[0]}: {exc}") from None


def _json_body(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        return {"error": data[:200].decode(errors="replace")}
    return doc if isinstance(doc, dict) else {"answer": doc}


def parse_duration_ms(text: str) -> int:
    """``--delay``: :func:`kdelay.durations.duration_ms`, its error as a click usage error."""
    try:
        return durations.duration_ms(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--delay") from None
