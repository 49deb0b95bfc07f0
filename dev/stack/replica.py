"""The command line of one delay-service replica, written in one place.

The local stack (:mod:`dev.stack.stack`), the test fixtures (``tests/support/replicas.py``)
and the delay-service benchmark (``bench/delay_service.py``) all start replicas as
``kdelay delay-service`` subprocesses. Each describes its replica with a :class:`ReplicaSpec`
and prefixes :meth:`ReplicaSpec.args` with its own way to run ``kdelay``, so a renamed flag
changes here only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """The settings a launcher passes to one replica; None leaves the replica's default.

    Every field but ``extra_args`` is the flag of the same name (``zk_root`` -> ``--zk-root``).
    ``extra_args`` come last, so a test can override any flag above (the last one wins).
    """

    name: str
    bootstrap_servers: str
    zk_connect: str
    data_dir: Path
    zk_root: str | None = None
    shards: int | None = None
    shard: int | None = None
    zk_session_timeout: float | None = None
    buffer_topic: str | None = None
    buffer_partitions: int | None = None
    checkpoint_interval_ms: int | None = None
    status_interval_ms: int | None = None
    metrics_port: int | None = None
    log_level: str | None = None
    extra_args: tuple[str, ...] = ()

    def args(self) -> list[str]:
        """``delay-service --name NAME ...``: the arguments after the ``kdelay`` program."""
        out = ["delay-service"]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name != "extra_args" and value is not None:
                out += [f"--{field.name.replace('_', '-')}", str(value)]
        return [*out, *self.extra_args]
