"""``kdelay proxy``: run one proxy in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import click

from kdelay import logs, memory
from kdelay.config_loader import load
from kdelay.options import config_options
from kdelay.proxy.config import ProxyConfig


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
    if cfg.workers > 1:
        from kdelay.proxy import workers

        code = workers.run(cfg)
    else:
        code = asyncio.run(_serve(cfg))
    if code:
        sys.exit(code)


async def _serve(cfg: ProxyConfig) -> int:
    """Serve until a signal (0), or until a component cannot be kept running (EXIT_GAVE_UP:
    the orchestrator restarts the process)."""
    from kdelay.proxy.app import Proxy
    from kdelay.proxy.restarts import EXIT_GAVE_UP
    from kdelay.proxy.workers import READY

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    proxy = Proxy(cfg)
    try:
        addresses = await proxy.start()
        memory.freeze_startup_objects()  # no full collection walks them again (kdelay/memory.py)
        click.echo(f"{READY} kafka={addresses.kafka} http={addresses.http}")
        assert proxy.gave_up is not None
        waits = [asyncio.create_task(stop.wait()), asyncio.create_task(proxy.gave_up.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in waits:
            task.cancel()
        return EXIT_GAVE_UP if proxy.gave_up.is_set() else 0
    finally:
        await proxy.stop()
