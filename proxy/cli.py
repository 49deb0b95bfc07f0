"""``kdelay proxy``: run one proxy in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import click

from kdelay import logs
from kdelay.config import load
from proxy.config import ProxyConfig


@click.command("proxy")
@click.option("--listen", help="Kafka listener host:port (default 127.0.0.1:9192)")
@click.option("--advertised-host", help="host clients are told to connect to (Kubernetes)")
@click.option("--advertised-port", type=int, help="port clients are told to connect to")
@click.option("--http-listen", help="HTTP API host:port (default 127.0.0.1:8180)")
@click.option("--bootstrap-servers", help="upstream Kafka bootstrap servers")
@click.option("--buffer-partitions", type=int, help="partitions of __kdelay_buffer when created")
@click.option("--max-request-bytes", type=int, help="largest Kafka request accepted")
@click.option(
    "--max-decompressed-bytes",
    type=int,
    help="largest size a compressed batch may expand to (default: --max-request-bytes)",
)
@click.option("--idle-timeout-s", type=float, help="close connections idle this long")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), help="PEM cert")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), help="PEM key")
@click.option("--log-level", help="DEBUG, INFO, WARNING or ERROR")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON or YAML file of settings (KDELAY_PROXY_* variables and flags override it)",
)
def command(config_file: Path | None, **flags: Any) -> None:
    """Run the Kafka-protocol proxy and its HTTP API."""
    cfg = load(ProxyConfig, flags, config_file)
    logs.configure(cfg.log_level)
    asyncio.run(_serve(cfg))


async def _serve(cfg: ProxyConfig) -> None:
    from proxy.app import Proxy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    proxy = Proxy(cfg)
    try:
        addresses = await proxy.start()
        click.echo(f"kdelay proxy ready kafka={addresses.kafka} http={addresses.http}")
        await stop.wait()
    finally:
        await proxy.stop()
