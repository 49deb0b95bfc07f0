"""``kdelay proxy``: run one proxy in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import click

from kdelay import logs
from kdelay.config import load
from kdelay.options import config_options
from proxy.config import ProxyConfig


@click.command("proxy")
@config_options(ProxyConfig)
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
