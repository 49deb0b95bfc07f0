"""An in-process proxy on free loopback ports, for the proxy's integration tests."""

from __future__ import annotations

from typing import Any

from kdelay.local import free_port
from proxy import ProxyConfig


def loopback_config(bootstrap: str, **overrides: Any) -> ProxyConfig:
    """A proxy config listening on free loopback ports (Kafka and HTTP) in front of ``bootstrap``;
    3 buffer partitions unless ``overrides`` say otherwise."""
    settings: dict[str, Any] = {
        "listen": f"127.0.0.1:{free_port()}",
        "http_listen": f"127.0.0.1:{free_port()}",
        "bootstrap_servers": bootstrap,
        "buffer_partitions": 3,
        **overrides,
    }
    return ProxyConfig(**settings)
