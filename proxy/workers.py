"""``kdelay proxy --workers N``: N proxy processes sharing one Kafka port and one HTTP port.

A proxy process serves everything on one asyncio loop, so it uses one core at most. With
``--workers N`` (N > 1) ``kdelay proxy`` becomes a small supervisor: it starts N worker
processes, each a whole proxy (Kafka listener, HTTP API, upstream producer, proxy/app.py) whose
listening sockets set ``SO_REUSEPORT``, so the kernel spreads new connections over them. It
restarts a worker that exits (under the one restart policy, kdelay/supervision.py) and stops
them all on SIGINT or SIGTERM. Kafka and ZooKeeper stay the only shared state: no protocol
between workers.

What the workers share, and what they do not:

- *a connection* is served by one worker for its whole life; a producer's batches on it are
  written by that worker's upstream producer, in order.
- *idempotence* (proxy/kafka/idempotence.py) is per worker: a producer whose connection breaks may
  reconnect to another worker, which adopts its producer id at the sequence it presents. A retry
  sent after that reconnect, of a batch written before it, is then written again, as across a
  restart of a single proxy. Without a reconnect nothing changes.
- *metrics*: each worker records its values in files under a directory this process owns
  (prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``), and ``/metrics`` on
  any worker reports all of them together (proxy/metrics.py).
- *ports*: a port of 0 is resolved here first (a socket bound with ``SO_REUSEPORT`` and held
  until the end, never listening), so every worker, and every restart, binds the same one.

Each worker gets the resolved settings as a private JSON file (the upstream settings may hold
credentials: the directory is the user's only) and no ``KDELAY_PROXY_*`` variable, which would
override the file, except one per secret (a password), which never goes to the file. A worker
is SIGKILLed by the kernel when this process dies (``PR_SET_PDEATHSIG``,
kdelay/children.py), so none outlives its supervisor.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click
from pydantic import SecretStr

from kdelay import logs
from kdelay.backoff import Backoff
from kdelay.children import die_with_parent
from kdelay.errors import InfrastructureError
from kdelay.proxy.config import ProxyConfig
from kdelay.proxy.kafka.server import reuse_port_socket
from kdelay.proxy.restarts import MAX_BACKOFF_S
from kdelay.stop_signals import on_stop_signals
from kdelay.supervision import RestartPolicy, Supervisor

log = logs.get(__name__)

#: The start of the one line ``kdelay proxy`` prints on stdout once it serves (proxy/cli.py):
#: scripts wait for it, and so does the supervisor here, from each worker.
READY = "kdelay proxy ready"
#: How long a worker may take to print READY.
START_TIMEOUT_S = 120.0
#: How long a stopping worker may take to deliver what it holds before it is killed.
STOP_GRACE_S = 30.0
#: How often the supervisor looks at its workers.
WATCH_INTERVAL_S = 0.2


def reserve(setting: str, host: str, port: int) -> socket.socket:
    """A socket that keeps host:port (a free port when ``port`` is 0) for the workers, who
    bind it the same way (``SO_REUSEPORT``); it never listens, so it takes no connection.
    Raises InfrastructureError naming ``setting`` when the port is taken."""
    try:
        return reuse_port_socket(host, port)
    except OSError as exc:
        raise InfrastructureError(
            f"{setting} {host}:{port}: the proxy workers cannot listen there: {exc}"
        ) from None


def _address(host: str, sock: socket.socket) -> str:
    port = int(sock.getsockname()[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True)
class _Worker:
    index: int
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    restart_at: float | None = None
    ready_line: str = ""


class Workers:
    """Runs ``cfg.workers`` proxy processes until :meth:`stop`."""

    def __init__(self, cfg: ProxyConfig, *, backoff: Backoff | None = None) -> None:
        self.cfg = cfg
        self.backoff = backoff or Backoff(
            initial_s=max(cfg.component_restart_backoff_s, 0.1), cap_s=MAX_BACKOFF_S
        )
        self._restarts = Supervisor(RestartPolicy(self.backoff, max_failures=None))
        self._reserved = [reserve("listen", *cfg.listen_address)]
        try:
            self._reserved.append(reserve("http_listen", *cfg.http_address))
        except InfrastructureError:
            self._reserved[0].close()
            raise
        self._dir = Path(tempfile.mkdtemp(prefix="kdelay-proxy-"))  # 0700: settings inside
        self._metrics_dir = self._dir / "metrics"
        self._metrics_dir.mkdir()
        kafka_host, http_host = cfg.listen_address[0], cfg.http_address[0]
        self.listen = _address(kafka_host, self._reserved[0])
        self.http_listen = _address(http_host, self._reserved[1])
        # Secrets (SecretStr settings: passwords) go by environment only, never to the file,
        # which would hold them masked anyway (model_dump shows **********).
        secrets = {
            name: value.get_secret_value()
            for name in type(cfg).model_fields
            if isinstance(value := getattr(cfg, name), SecretStr)
        }
        settings = cfg.model_dump(mode="json", exclude=set(secrets))
        settings.update(
            workers=1, reuse_port=True, listen=self.listen, http_listen=self.http_listen
        )
        self._settings = self._dir / "worker.json"
        fd = os.open(self._settings, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(settings, out)
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("KDELAY_PROXY_")}
        self._env.update({f"KDELAY_PROXY_{name.upper()}": v for name, v in secrets.items()})
        self._env["PROMETHEUS_MULTIPROC_DIR"] = str(self._metrics_dir)
        self._workers = [_Worker(i) for i in range(cfg.workers)]
        self._stop = threading.Event()
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        """The process ids of the running workers."""
        return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.poll() is None]

    def _spawn(self, worker: _Worker) -> None:
        argv = [sys.executable, "-m", "kdelay", "proxy", "--config", str(self._settings)]
        worker.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            text=True,
            env=self._env,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - prctl only, no imports or locks
        )
        worker.started = time.monotonic()
        worker.restart_at = None
        worker.ready_line = ""
        threading.Thread(
            target=self._read,
            args=(worker, worker.proc),
            name=f"worker-{worker.index}",
            daemon=True,
        ).start()

    @staticmethod
    def _read(worker: _Worker, proc: subprocess.Popen[str]) -> None:
        """Pass the worker's stdout on; remember its ready line."""
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(f"{READY} ") and worker.proc is proc:
                worker.ready_line = line.strip()
            else:
                sys.stdout.write(line)
                sys.stdout.flush()

    def start(self) -> str:
        """Start every worker and wait until each printed its ready line; returns that line
        (the same for all: one address each for Kafka and HTTP). Raises InfrastructureError
        when a worker exits or stays silent."""
        for worker in self._workers:
            self._spawn(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        for worker in self._workers:
            while not worker.ready_line:
                assert worker.proc is not None
                code = worker.proc.poll()
                if code is not None:
                    raise InfrastructureError(
                        f"proxy worker {worker.index} exited with status {code} before it was "
                        "ready (its log is above)"
                    )
                if time.monotonic() > deadline:
                    raise InfrastructureError(
                        f"proxy worker {worker.index} was not ready within {START_TIMEOUT_S:.0f} s"
                    )
                time.sleep(0.05)
        log.info(
            "proxy.workers_started",
            workers=len(self._workers),
            pids=self.pids,
            kafka=self.listen,
            http=self.http_listen,
        )
        return self._workers[0].ready_line

    def watch(self) -> None:
        """Restart workers that exit, until :meth:`stop`."""
        while not self._stop.wait(WATCH_INTERVAL_S):
            self.check()

    def check(self) -> None:
        """One look at the workers: note the ones that exited, restart those whose back-off
        is over."""
        from prometheus_client import multiprocess

        if self._stop.is_set():
            return  # stopping: a worker that exits now was told to (SIGTERM to the group)
        now = time.monotonic()
        for worker in self._workers:
            proc = worker.proc
            if proc is not None and (code := proc.poll()) is not None:
                multiprocess.mark_process_dead(proc.pid, str(self._metrics_dir))  # type: ignore[no-untyped-call]
                up_s = now - worker.started
                wait_s = self._restarts.failed(f"worker-{worker.index}", ran_s=up_s).delay_s
                worker.proc, worker.restart_at = None, now + wait_s
                log.warning(
                    "proxy.worker_exited",
                    worker=worker.index,
                    pid=proc.pid,
                    status=code,
                    up_s=round(up_s, 1),
                    restart_in_s=wait_s,
                )
            if worker.proc is None and worker.restart_at is not None and now >= worker.restart_at:
                self._spawn(worker)
                self.restarts += 1
                assert worker.proc is not None
                log.info("proxy.worker_restarted", worker=worker.index, pid=worker.proc.pid)

    def stop(self) -> None:
        """Make :meth:`watch` return (any thread, or a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        """SIGTERM every worker, wait for them to deliver what they hold (SIGKILL after
        STOP_GRACE_S), then release the ports and remove the settings and metrics files."""
        self._stop.set()
        procs = [w.proc for w in self._workers if w.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("proxy.worker_killed", pid=proc.pid, grace_s=STOP_GRACE_S)
                proc.kill()
                proc.wait()
        for sock in self._reserved:
            sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def run(cfg: ProxyConfig) -> int:
    """``kdelay proxy`` with ``cfg.workers`` > 1, in the foreground until SIGINT or SIGTERM;
    raises InfrastructureError when a worker cannot start."""
    workers = Workers(cfg)

    on_stop_signals(lambda _signum: workers.stop())
    try:
        click.echo(f"{workers.start()} workers={cfg.workers}")
        workers.watch()
    finally:
        workers.close()
    log.info("proxy.workers_stopped", restarts=workers.restarts)
    return 0
