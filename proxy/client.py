"""``kdelay send`` and ``kdelay cancel``: produce through the proxy with confluent-kafka.

Both log in to a SASL proxy listener like any Kafka client (:class:`ClientSecurity`): the
``--kafka-*`` flags, or ``KDELAY_KAFKA_*`` variables; the password only from
``KDELAY_KAFKA_SASL_PASSWORD`` or ``--kafka-sasl-password-file``, never a flag.
"""

from __future__ import annotations

import json
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


@click.command("cancel")
@click.option("--bootstrap-servers", required=True, help="the proxy's host:port")
@click.option(
    "--topic",
    default=None,
    help="topic that carries the cancel: one you may WRITE, e.g. the message's own (with "
    "SASL the proxy checks WRITE on it) [__kdelay_buffer]",
)
@config_options(ClientSecurity)
@click.argument("message_id")
def cancel_command(
    bootstrap_servers: str, topic: str | None, message_id: str, **security: Any
) -> None:
    """Cancel the pending message MESSAGE_ID (a no-op if it was already delivered)."""
    login = client_config(security)
    try:
        h.validate_id(h.CANCEL, message_id.encode())
    except InvalidHeaderError as exc:
        raise click.BadParameter(exc.problem, param_hint="MESSAGE_ID") from None
    # The carrier topic is irrelevant to the cancel: the proxy turns the record into a
    # buffer-topic cancel. The buffer topic always exists, and it is the one internal topic the
    # proxy lets a cancel (and nothing else) be addressed to (proxy/internal_topics.py); but
    # with SASL the proxy checks WRITE on the carrier, and WRITE on __kdelay_buffer would let
    # a principal write the buffer directly: --topic names one it may write anyway.
    carrier = topic or buffer.BUFFER_TOPIC
    produce_one(
        bootstrap_servers,
        carrier,
        b"",
        None,
        headers=[(h.CANCEL, message_id.encode())],
        config=login,
    )
    click.echo(json.dumps({"id": message_id, "cancel": "accepted"}))


def parse_duration_ms(text: str) -> int:
    """``--delay``: :func:`kdelay.durations.duration_ms`, its error as a click usage error."""
    try:
        return durations.duration_ms(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--delay") from None
