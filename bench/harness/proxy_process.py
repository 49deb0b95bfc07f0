"""A ``kdelay proxy`` subprocess for benchmarks that need its pid (RSS) or extra settings."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dev.stack import KDELAY, KafkaSettings, LocalKafka, free_port


@dataclass(frozen=True)
class RunningProxy:
    """Where a started proxy listens, and its process id."""

    kafka: str
    http: str
    pid: int


@contextmanager
def local_kafka(bootstrap: str | None) -> Iterator[str]:
    """``bootstrap`` when given, else a local single-broker Kafka for the run."""
    if bootstrap:
        yield bootstrap
        return
    settings = KafkaSettings(quick_jit=False)  # measured under load: the full JIT
    with (
        tempfile.TemporaryDirectory(prefix="kdelay-bench-") as tmp,
        LocalKafka(Path(tmp), settings=settings) as k,
    ):
        yield k.bootstrap_servers


@contextmanager
def proxy_process(bootstrap: str, *settings: str) -> Iterator[RunningProxy]:
    """``kdelay proxy`` in front of ``bootstrap`` with extra command-line ``settings``, on free
    loopback ports, until the block exits."""
    port, http_port = free_port(), free_port()
    argv = [
        KDELAY, "proxy", "--listen", f"127.0.0.1:{port}",
        "--http-listen", f"127.0.0.1:{http_port}", "--bootstrap-servers", bootstrap,
        "--log-level", "WARNING", *settings,
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "ready" not in line:
            raise RuntimeError(f"proxy did not start: {line!r}")
        yield RunningProxy(f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}", proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
