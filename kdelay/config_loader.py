"""Typed, frozen component configuration from flags, ``KDELAY_*`` variables or a file.

Each component declares one ``pydantic_settings.BaseSettings`` subclass with
``model_config = component_config("KDELAY_PROXY_")``-style settings and loads it with
:func:`load`. Precedence: command-line flags > environment > config file (JSON or YAML) >
defaults. Validation happens once, at start-up; a failure raises ConfigError naming the
setting, its source variable and the problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from kdelay.errors import ConfigError

S = TypeVar("S", bound=BaseSettings)


class TopicDurability(BaseModel):
    """The internal topics' durability settings, shared by every component that creates them
    (the proxy and the delay service; kdelay/topics.py applies them)."""

    buffer_replication: int | None = Field(
        default=None,
        ge=1,
        description="replication factor of the internal topics it creates [auto: min(3, brokers)]",
    )
    buffer_min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        description="min.insync.replicas of the internal topics it creates "
        "[auto: min(2, replication)]",
    )

    @model_validator(mode="after")
    def _durability(self) -> TopicDurability:
        isr, rf = self.buffer_min_insync_replicas, self.buffer_replication
        if isr is not None and rf is not None and isr > rf:
            raise ValueError(
                f"buffer_min_insync_replicas ({isr}) must not exceed buffer_replication ({rf}): "
                "no write could ever be acknowledged"
            )
        return self


def component_config(env_prefix: str) -> SettingsConfigDict:
    """The shared settings behaviour: frozen, env prefix, unknown keys rejected."""
    return SettingsConfigDict(
        env_prefix=env_prefix, frozen=True, extra="forbid", case_sensitive=False
    )


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid JSON/YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of setting: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load(cls: type[S], flags: dict[str, Any] | None = None, config_file: Path | None = None) -> S:
    """Build ``cls`` from defaults < file < environment < flags (flags that are None are unset).

    Raises ConfigError with one line per invalid setting.
    """
    file_values = _read_file(config_file) if config_file else {}
    explicit = {k: v for k, v in (flags or {}).items() if v is not None}
    try:
        # The variables set, read but not validated on their own: a check across settings
        # (a password from the environment, its user from a flag) sees them all at once.
        from_env = EnvSettingsSource(cls)()
        merged = {**file_values, **from_env, **explicit}
        return cls(**merged)
    except ValidationError as exc:
        prefix = str(cls.model_config.get("env_prefix", ""))
        lines = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "(settings)"
            env_var = f"{prefix}{name}".upper()
            lines.append(
                f"setting {name!r} (flag --{name.replace('_', '-')}, {env_var}): {err['msg']}"
            )
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None
