"""How a kdelay component logs in to Kafka: one settings mixin for every client of Kafka.

The replicas, the verifier, the proxy's upstream producer and the ``kdelay`` commands all take
the same settings (``kafka_security_protocol``, ``kafka_sasl_mechanism``,
``kafka_sasl_username``, the password and ``kafka_ssl_ca_file``) and turn them into librdkafka's
names with :meth:`KafkaClientSecurity.kafka_client_config`.

The password is a secret: it comes from ``kafka_sasl_password`` (an environment variable such
as ``KDELAY_REPLICA_KAFKA_SASL_PASSWORD``, or the config file: it gets no command-line flag, see
kdelay/options.py) or from the file ``kafka_sasl_password_file`` (a mounted Kubernetes Secret).
It is held as a ``SecretStr``, so a printed or logged configuration shows ``**********``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator

from kdelay.secrets import read_secret_file

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: Mechanisms a kdelay component logs in with (a component has a password, not a token issuer).
CLIENT_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaClientSecurity(BaseModel):
    """Kafka client security settings shared by every component (see the module docstring)."""

    kafka_security_protocol: str = Field(
        default="PLAINTEXT",
        description="how this component connects to Kafka: PLAINTEXT, SSL, SASL_PLAINTEXT or "
        "SASL_SSL (librdkafka's security.protocol)",
    )
    kafka_sasl_mechanism: str = Field(
        default="SCRAM-SHA-512",
        description="SASL mechanism with SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    )
    kafka_sasl_username: str | None = Field(
        default=None, description="the Kafka user this component logs in as (SASL_*)"
    )
    kafka_sasl_password: SecretStr | None = Field(
        default=None,
        description="that user's password: environment or config file only, never a flag "
        "[kafka_sasl_password_file]",
    )
    kafka_sasl_password_file: Path | None = Field(
        default=None, description="file holding that user's password (a mounted Secret)"
    )
    kafka_ssl_ca_file: Path | None = Field(
        default=None,
        description="PEM CA bundle that signed Kafka's certificates (SSL, SASL_SSL) [the system's]",
    )

    @model_validator(mode="after")
    def _kafka_security(self) -> KafkaClientSecurity:
        protocol = self.kafka_security_protocol.upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(
                f"kafka_security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                f"got {self.kafka_security_protocol!r}"
            )
        if not protocol.startswith("SASL_"):
            return self
        if self.kafka_sasl_mechanism.upper() not in CLIENT_MECHANISMS:
            raise ValueError(
                f"kafka_sasl_mechanism must be one of {', '.join(CLIENT_MECHANISMS)}, "
                f"got {self.kafka_sasl_mechanism!r}"
            )
        if not self.kafka_sasl_username:
            raise ValueError(f"kafka_security_protocol={protocol} needs kafka_sasl_username")
        if (self.kafka_sasl_password is None) == (self.kafka_sasl_password_file is None):
            raise ValueError(
                f"kafka_security_protocol={protocol} needs exactly one of kafka_sasl_password "
                "(environment or config file) and kafka_sasl_password_file"
            )
        if self.kafka_sasl_password_file is not None:
            read_secret_file(self.kafka_sasl_password_file, "kafka_sasl_password_file")
        return self

    @property
    def kafka_sasl(self) -> bool:
        """True when this component logs in to Kafka with SASL."""
        return self.kafka_security_protocol.upper().startswith("SASL_")

    def kafka_password(self) -> str:
        """The SASL password (read from its file each call, so a rotated Secret is seen)."""
        if self.kafka_sasl_password is not None:
            return self.kafka_sasl_password.get_secret_value()
        if self.kafka_sasl_password_file is not None:
            return read_secret_file(self.kafka_sasl_password_file, "kafka_sasl_password_file")
        raise ValueError("no kafka_sasl_password or kafka_sasl_password_file is set")

    def kafka_client_config(self) -> dict[str, str]:
        """These settings in librdkafka's names, to merge into a client's configuration."""
        protocol = self.kafka_security_protocol.upper()
        out = {"security.protocol": protocol}
        if self.kafka_ssl_ca_file is not None and protocol in ("SSL", "SASL_SSL"):
            out["ssl.ca.location"] = str(self.kafka_ssl_ca_file)
        if self.kafka_sasl:
            out["sasl.mechanism"] = self.kafka_sasl_mechanism.upper()
            out["sasl.username"] = self.kafka_sasl_username or ""
            out["sasl.password"] = self.kafka_password()
        return out

    def kafka_connection(self, bootstrap_servers: str) -> dict[str, str]:
        """A client's connection settings: ``bootstrap_servers`` and these settings."""
        return {"bootstrap.servers": bootstrap_servers, **self.kafka_client_config()}

    def kafka_principal(self) -> str | None:
        """The Kafka principal this component logs in as (``User:<username>``: PLAIN and SCRAM
        principals are the user name), or None without SASL."""
        if not self.kafka_sasl or not self.kafka_sasl_username:
            return None
        return f"User:{self.kafka_sasl_username}"


def merge_client_config(
    security: dict[str, str], extra: dict[str, str], extra_setting: str
) -> dict[str, str]:
    """``security`` (a :meth:`KafkaClientSecurity.kafka_client_config`) with ``extra`` (raw
    librdkafka settings, e.g. the proxy's ``upstream_config``) on top: ``extra`` wins for what
    the security settings do not name, or name alike. A ``security.protocol`` set to PLAINTEXT
    by the security settings' default gives way to ``extra``'s; set explicitly in both and
    different, it is a ValueError naming both settings. ``sasl.*`` and ``ssl.ca.location``
    given by both and different are refused the same way."""
    merged = dict(security)
    for key, value in extra.items():
        mine = security.get(key)
        if mine is None or mine == value or (key == "security.protocol" and mine == "PLAINTEXT"):
            merged[key] = value
            continue
        shown = "**********" if "password" in key else repr(value)
        raise ValueError(
            f"{extra_setting}[{key!r}]={shown} contradicts the kafka_* security settings "
            f"({_SETTING_OF.get(key, key)}): set it in one place only"
        )
    return merged


_SETTING_OF = {
    "security.protocol": "kafka_security_protocol",
    "sasl.mechanism": "kafka_sasl_mechanism",
    "sasl.username": "kafka_sasl_username",
    "sasl.password": "kafka_sasl_password",
    "ssl.ca.location": "kafka_ssl_ca_file",
}
