"""Whether the local stack is up, asked of its processes over HTTP as a user would.

The proxy is up when its ``/readyz`` answers 200, a replica when its ``/metrics`` does; the
stack is ready once every one is up and each shard has a master (a replica whose
``kdelay_replica_is_master`` gauge is 1). :class:`dev.stack.stack.LocalStack` waits for that
before ``kdelay up`` prints ``kdelay ready``, and asks it again for its masters.
"""

from __future__ import annotations

import functools
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dev.stack.process import ManagedProcess, log_tails, wait_until
from kdelay.errors import InfrastructureError

HOST = "127.0.0.1"
_MASTER = re.compile(r"^kdelay_replica_is_master(?:\{[^}]*\})? 1(?:\.0)?$", re.M)


@dataclass
class Replica:
    """A replica the stack started, and where its metrics are."""

    name: str
    metrics_port: int
    process: ManagedProcess
    shard: int = 0

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}"


def masters(replicas: Iterable[Replica]) -> dict[int, str]:
    """Per shard, the replica whose metrics say it is master (shards without one left out)."""
    found: dict[int, str] = {}
    for replica in replicas:
        if replica.shard in found:
            continue
        body = http_get(f"{replica.metrics_url}/metrics")
        if body is not None and _MASTER.search(body):
            found[replica.shard] = replica.name
    return found


def wait_ready(
    proxy: ManagedProcess,
    http_url: str,
    ca_file: Path | None,
    replicas: list[Replica],
    *,
    shards: int,
    timeout: float,
) -> None:
    """Wait for the proxy's ``/readyz``, every replica's ``/metrics`` and a master per shard;
    InfrastructureError naming what did not come up (with the replicas' last log lines when
    no master was elected)."""
    wait_until(
        lambda: http_ok(f"{http_url}/readyz", ca_file),
        timeout=timeout,
        what="the proxy's /readyz",
        interval=0.2,
        proc=proxy,
    )
    for replica in replicas:
        wait_until(
            functools.partial(http_ok, f"{replica.metrics_url}/metrics"),
            timeout=timeout,
            what=f"{replica.name}'s /metrics",
            interval=0.2,
            proc=replica.process,
        )
    try:
        wait_until(
            lambda: len(masters(replicas)) == shards,
            timeout=timeout,
            what="a delay-service master" + (" per shard" if shards > 1 else ""),
            interval=0.2,
        )
    except InfrastructureError as exc:
        tails = log_tails((r.process for r in replicas), lines=15)
        raise InfrastructureError(f"{exc}; the replicas' last log lines:\n{tails}") from None


def http_get(url: str, ca_file: Path | None = None) -> str | None:
    """The body of a 200 answer to GET ``url``; None when it answers otherwise or not at all."""
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:  # noqa: S310
            return resp.read().decode("utf-8", "replace") if resp.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def http_ok(url: str, ca_file: Path | None = None) -> bool:
    """Whether GET ``url`` answers 200."""
    return http_get(url, ca_file) is not None
