"""``kdelay spark up``: a standalone Spark cluster on loopback, from pyspark's own jars.

A master and N workers, each its own process (``<pyspark>/bin/spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``) with its own work directory
and log under the run directory, on free 127.0.0.1 ports; ``SPARK_HOME`` is pyspark's package
directory, ``SPARK_LOCAL_IP`` 127.0.0.1. It is what ``kdelay verify --spark-master spark://...``
runs on in the tests and benchmarks, and a way to try the verifier on a real cluster.

:class:`SparkCluster` (a context manager) starts them and waits until the master's ``/json/``
reports ``"status": "ALIVE"`` with N alive workers. Every process is a
:class:`dev.stack.process.ManagedProcess` (own process group, SIGKILLed when its owner dies,
marked ``kdelay.managed``); a worker's executors are its children, in its group, so stopping
or killing a worker stops its executors too. ``command`` runs it in the foreground like
``kdelay up``: prints ``spark ready`` and the master URL, writes the state file
``{"spark_master", "spark_ui", "workers": [{"pid", "ui"}]}`` (0644, atomically; removed on
exit) and stops every process on SIGINT or SIGTERM.

Threading: one SparkCluster is driven by one thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import click

from dev.stack.process import MARKER, ManagedProcess, free_port, wait_until
from kdelay import logs
from kdelay.errors import InfrastructureError
from kdelay.jars import java_executable
from kdelay.stop_signals import on_stop_signals

log = logs.get(__name__)

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: Heap of the master and worker daemons themselves (executors take --memory).
DAEMON_MEMORY = "256m"


def spark_home() -> Path:
    """pyspark's package directory: its ``jars/`` and ``bin/spark-class`` are a Spark."""
    try:
        import pyspark
    except ModuleNotFoundError:
        raise InfrastructureError(
            "kdelay spark needs PySpark: pip install 'kdelay[verifier]' (make install does this)"
        ) from None
    home = Path(str(pyspark.__file__)).parent
    if not (home / "bin" / "spark-class").is_file():
        raise InfrastructureError(f"pyspark at {home} has no bin/spark-class")
    return home


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class Worker:
    """One worker process and its web UI."""

    proc: ManagedProcess
    ui: str
    work_dir: Path


class SparkCluster:
    """A standalone master and ``workers`` workers under ``base_dir`` (see the module doc)."""

    def __init__(
        self,
        base_dir: Path,
        *,
        workers: int = 2,
        port: int = 0,
        webui_port: int = 0,
        worker_cores: int = 1,
        worker_memory: str = "1g",
        timeout: float = 120.0,
    ) -> None:
        if workers < 1:
            raise InfrastructureError(f"--workers must be at least 1, not {workers}")
        self.base_dir = base_dir.resolve()
        self.workers_wanted = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.timeout = timeout
        self._port = port
        self._webui_port = webui_port
        self.master: ManagedProcess | None = None
        self.workers: list[Worker] = []
        self.master_url = ""
        self.ui_url = ""

    # -- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        java = java_executable()
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=HOST,
            SPARK_LOG_DIR=str(self.base_dir / "logs"),
            SPARK_WORKER_DIR=str(self.base_dir / "work"),
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            # The master and workers are marked; executors are not (their command line is the
            # application's): they are in their worker's process group and exit with it.
            SPARK_DAEMON_JAVA_OPTS=f"-D{MARKER}={os.getpid()}",
        )
        if "JAVA_HOME" not in env:
            env["JAVA_HOME"] = str(Path(os.path.realpath(java)).parents[1])
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        return env

    def start(self, progress: Any = None) -> None:
        """Start the master, then the workers; return once all are alive at the master."""
        say = progress or (lambda _line: None)
        env = self._env()
        spark_class = str(spark_home() / "bin" / "spark-class")
        port = self._port or free_port(HOST)
        webui = self._webui_port or free_port(HOST)
        for p, option in ((port, "--port"), (webui, "--webui-port")):
            if not _port_free(p):
                raise InfrastructureError(f"port {p} on {HOST} is taken ({option})")
        self.master_url = f"spark://{HOST}:{port}"
        self.ui_url = f"http://{HOST}:{webui}"
        logs_dir = self.base_dir / "logs"
        argv = [spark_class, MASTER_CLASS, "--host", HOST, "--port", str(port)]
        argv += ["--webui-port", str(webui)]
        self.master = ManagedProcess("spark-master", argv, logs_dir / "master.log", env=env)
        self.master.start()
        log.info("spark.master_started", url=self.master_url, ui=self.ui_url, pid=self.master.pid)
        say(f"    spark master {self.master_url} (ui {self.ui_url})")
        wait_until(
            self._master_alive, timeout=self.timeout, what="the Spark master", proc=self.master
        )
        for i in range(self.workers_wanted):
            self._start_worker(i, spark_class, env)
        wait_until(self._all_alive, timeout=self.timeout, what=f"{self.workers_wanted} workers")
        log.info("spark.cluster_ready", master=self.master_url, workers=len(self.workers))

    def _start_worker(self, i: int, spark_class: str, env: dict[str, str]) -> None:
        ui_port = free_port(HOST)
        work_dir = self.base_dir / f"worker-{i}"
        work_dir.mkdir(parents=True, exist_ok=True)
        argv = [spark_class, WORKER_CLASS, self.master_url, "--host", HOST]
        argv += ["--webui-port", str(ui_port), "--work-dir", str(work_dir)]
        argv += ["--cores", str(self.worker_cores), "--memory", self.worker_memory]
        log_path = self.base_dir / "logs" / f"worker-{i}.log"
        proc = ManagedProcess(f"spark-worker-{i}", argv, log_path, env=env)
        proc.start()
        worker = Worker(proc, f"http://{HOST}:{ui_port}", work_dir)
        self.workers.append(worker)
        log.info("spark.worker_started", worker=i, pid=proc.pid, ui=worker.ui, log=str(log_path))

    def stop(self) -> None:
        """Stop every worker (and its executors), then the master."""
        for w in self.workers:
            w.proc.stop(grace=10.0)
        if self.master is not None:
            self.master.stop(grace=10.0)
        log.info("spark.cluster_stopped", master=self.master_url)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and its executors (a lost machine)."""
        self.workers[i].proc.kill()
        log.info("spark.worker_killed", worker=i)

    # -- state -----------------------------------------------------------------------------

    def master_json(self) -> dict[str, Any]:
        """The master's ``/json/`` page."""
        url = f"{self.ui_url}/json/"  # http://127.0.0.1:port, built here
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def _master_alive(self) -> bool:
        try:
            return self.master_json().get("status") == "ALIVE"
        except (OSError, ValueError):
            return False

    def _all_alive(self) -> bool:
        for i, w in enumerate(self.workers):
            if not w.proc.alive():
                raise InfrastructureError(
                    f"Spark worker {i} exited with code {w.proc.returncode()}; log "
                    f"{w.proc.log_path}:\n{w.proc.log_tail(30)}"
                )
        if self.master is not None and not self.master.alive():
            raise InfrastructureError(
                f"the Spark master exited with code {self.master.returncode()}; log "
                f"{self.master.log_path}:\n{self.master.log_tail(30)}"
            )
        try:
            data = self.master_json()
        except (OSError, ValueError):
            return False
        return data.get("status") == "ALIVE" and data.get("aliveworkers") == len(self.workers)

    def state(self) -> dict[str, Any]:
        """The state file's content."""
        return {
            "spark_master": self.master_url,
            "spark_ui": self.ui_url,
            "workers": [{"pid": w.proc.pid, "ui": w.ui} for w in self.workers],
        }

    def lost(self) -> str | None:
        """What died (naming its log), or None while every process runs."""
        procs = ([self.master] if self.master else []) + [w.proc for w in self.workers]
        for p in procs:
            if not p.alive():
                return f"{p.name} exited with code {p.returncode()}; log {p.log_path}"
        return None


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically, mode 0644."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.chmod(0o644)
    tmp.replace(path)


def _echo(line: str) -> None:
    click.echo(line, err=True)


@click.group("spark")
def command() -> None:
    """A local standalone Spark cluster for the verifier (development)."""


@command.command("up")
@click.option("--workers", type=click.IntRange(1, 16), default=2, help="worker processes")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="master port (0: free)")
@click.option(
    "--webui-port", type=click.IntRange(0, 65535), default=0, help="master web UI (0: free)"
)
@click.option("--worker-cores", type=click.IntRange(1, 64), default=1, help="cores per worker")
@click.option("--worker-memory", default="1g", help="memory per worker (its executors')")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".kdelay/spark"),
    help="logs and work directories",
)
@click.option(
    "--state-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path(".kdelay/spark.json"),
)
def up(
    *,
    workers: int,
    port: int,
    webui_port: int,
    worker_cores: int,
    worker_memory: str,
    run_dir: Path,
    state_file: Path,
) -> None:
    """Start a Spark master and N workers on 127.0.0.1; print `spark ready`; keep them running
    until SIGINT or SIGTERM (a process that exits stops the cluster, naming its log)."""
    logs.configure("INFO", json=False)
    cluster = SparkCluster(
        run_dir,
        workers=workers,
        port=port,
        webui_port=webui_port,
        worker_cores=worker_cores,
        worker_memory=worker_memory,
    )
    stop = threading.Event()
    on_stop_signals(lambda _signum: stop.set())
    lost: str | None = None
    try:
        cluster.start(progress=_echo)
        if not stop.is_set():
            write_state(state_file, cluster.state())
            _echo(
                f"    {workers} workers; logs in {cluster.base_dir / 'logs'}, state in {state_file}"
            )
            click.echo(f"spark ready {cluster.master_url}")
            sys.stdout.flush()
        while not stop.wait(1.0):
            lost = cluster.lost()
            if lost is not None:
                break
    finally:
        cluster.stop()
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
    if lost is not None:
        _echo(f"kdelay: error: {lost}")
        sys.exit(1)
    _echo("spark stopped")
