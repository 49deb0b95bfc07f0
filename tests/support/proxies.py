"""An in-process proxy on free loopback ports, for the proxy's integration tests."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dev.stack import KDELAY, free_port, wait_until
from dev.stack.process import ManagedProcess
from kdelay.proxy import ProxyConfig


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


def accepting(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def proxy_process(
    bootstrap: str,
    log_path: Path,
    *,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> tuple[ManagedProcess, int]:
    """A ``kdelay proxy`` subprocess (not started) on a free loopback port, and that port;
    ``prefix`` runs it under another command (``faketime -f -5s``)."""
    port = free_port()
    argv = [
        *prefix, KDELAY, "proxy", "--listen", f"127.0.0.1:{port}",
        "--http-listen", f"127.0.0.1:{free_port()}",
        "--bootstrap-servers", bootstrap,
    ]  # fmt: skip
    return ManagedProcess("proxy", argv, log_path, env={**os.environ, **(env or {})}), port


def wait_accepting(port: int, timeout: float = 60.0) -> None:
    """Wait until the proxy on ``port`` accepts connections."""
    wait_until(lambda: accepting(port), timeout=timeout, what=f"a proxy to listen on {port}")
