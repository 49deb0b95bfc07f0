"""The error hierarchy: one root, specific subclasses, messages that name the culprit."""

from __future__ import annotations


class KdelayError(Exception):
    """Root of every error kdelay raises on purpose."""


class ConfigError(KdelayError):
    """A setting is missing or invalid; the message names the setting."""


class InfrastructureError(KdelayError):
    """A dependency (Java, Maven, Kafka, ZooKeeper) is missing or failed to start."""


class InvalidHeaderError(KdelayError):
    """A kdelay control header on a produced record is malformed; names the header."""

    def __init__(self, header: str, problem: str) -> None:
        super().__init__(f"header {header!r}: {problem}")
        self.header = header
        self.problem = problem


class BufferFormatError(KdelayError):
    """A buffer-topic record does not follow the buffer-record contract."""


class BrokerClockError(KdelayError):
    """The probe topic cannot tell broker time: it does not use LogAppendTime."""

    def __init__(self, topic: str, found: str) -> None:
        setting = "message.timestamp.type"
        super().__init__(
            f"topic {topic} has {setting}={found}; broker-clock probes need "
            f"{setting}=LogAppendTime (kafka-configs.sh --alter --entity-type topics "
            f"--entity-name {topic} --add-config {setting}=LogAppendTime)"
        )
