"""``kdelay verify``: the Spark verifier, continuous or ``--once`` (CONTRACT.md).

Continuous: runs until SIGINT/SIGTERM, publishing window results (stdout, ``--output-dir``,
``--output-topic``, Prometheus on ``--metrics-port``). ``--once``: a bounded run over what the
topics hold now; writes the report to ``--report FILE`` (exactly the CONTRACT.md keys, with
the v2 ``clock``, see :mod:`verifier.report`, and ``isolation``, the ``--isolation-level`` the
topics were read with), and next to it ``<stem>.details.json`` (pending, cancelled, unmatched
deliveries, per-window results, the end instant), ``<stem>.lateness.png`` (each message's
lateness by due time) and ``<stem>.histogram.png`` (lateness histogram). Exit status 1 when an
SLO given on the command line is missed (each missed SLO is named on stderr), 2 on a
configuration error.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kdelay import acl_check, logs, stats
from kdelay.acls import VERIFIER_GROUPS, Acl, verifier_acls
from kdelay.config_loader import load
from kdelay.options import config_options
from kdelay.stop_signals import on_stop_signals
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.metrics import Metrics
from kdelay.verifier.report import Slo, breaches
from kdelay.verifier.sinks import Sinks, write_json

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Reported in the details file, so a reader knows how the percentiles were computed.
PERCENTILE_METHOD = stats.METHOD_DESCRIPTION


@dataclass
class OnceOutcome:
    """What ``verify --once`` did: the report, the files written, the missed SLOs."""

    report: dict[str, Any]
    details: dict[str, Any]
    breaches: list[str]
    files: list[Path] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.breaches else 0


def verify_once(
    spark: SparkSession, cfg: VerifierConfig, slo: Slo, report_path: Path | None
) -> OnceOutcome:
    """Run the bounded verification, write the report, details, charts and window results."""
    from kdelay.verifier import chart, job

    result = job.run_once(spark, cfg)
    report = {**result.summary.report(), "isolation": cfg.isolation_level}
    details = {
        **result.summary.details(),
        "unmatched_deliveries": result.unmatched_deliveries,
        "end_ms": result.end_ms,
        "grace_ms": cfg.grace_ms,
        "window_ms": cfg.window_ms,
        "topics": result.topics,
        "percentile_method": PERCENTILE_METHOD,
        "windows": [w.as_dict() for w in result.windows],
    }
    outcome = OnceOutcome(report, details, breaches(result.summary, slo))
    if report_path is not None:
        write_json(report_path, report)
        details_path = report_path.with_name(f"{report_path.stem}.details.json")
        write_json(details_path, details)
        charts = chart.write_charts(result.windows, result.lateness_points, report_path)
        outcome.files = [report_path, details_path, *charts]
    metrics = Metrics() if cfg.metrics_port else None
    if metrics is not None:
        metrics.serve(cfg.metrics_port, cfg.metrics_host)
    sinks = Sinks(cfg, metrics)
    try:
        sinks.publish("once", result.windows, result.lateness_sample, console=False)
    finally:
        sinks.close()
    return outcome


def check_acls(cfg: VerifierConfig) -> list[Acl] | None:
    """With SASL, raise kdelay.acl_check.MissingAclsError naming each ACL the verifier's
    principal lacks (kdelay/acls.py); return those Kafka cannot be asked about, or None without
    SASL. Spark's group ids are random under ``groupIdPrefix``: one of them is asked."""
    principal = cfg.kafka_principal()
    if principal is None:
        return None
    return acl_check.require(
        "verifier",
        principal,
        verifier_acls(cfg.buffer_topic, output_topic=cfg.output_topic),
        cfg.kafka_connection(cfg.bootstrap_servers),
        probes={VERIFIER_GROUPS: f"{VERIFIER_GROUPS}-acl-check"},
    )


def verify_continuous(
    spark: SparkSession, cfg: VerifierConfig, stop: threading.Event, metrics: Metrics
) -> None:
    """Run the streaming verifier until ``stop`` is set."""
    from kdelay.verifier import stream

    sinks = Sinks(cfg, metrics)

    def handle(batch_id: int, windows: list[Any], lateness: list[float]) -> None:
        sinks.publish(f"batch-{batch_id:06d}", windows, lateness)

    try:
        stream.run_continuous(spark, cfg, handle, stop)
    finally:
        sinks.close()


@click.command("verify")
@click.option("--once", is_flag=True, help="Bounded run over what the topics hold now.")
@click.option(
    "--report", type=click.Path(dir_okay=False, path_type=Path), help="--once: report file."
)
@config_options(VerifierConfig)
@click.option("--max-p99-ms", type=float, help="SLO: p99 lateness at most this (ms).")
@click.option("--max-early", type=int, help="SLO: at most this many early deliveries.")
@click.option("--max-missing", type=int, help="SLO: at most this many missing messages.")
@click.option("--max-duplicates", type=int, help="SLO: at most this many duplicates.")
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON or YAML file of settings.",
)
def command(
    *,
    once: bool,
    report: Path | None,
    config_file: Path | None,
    max_p99_ms: float | None,
    max_early: int | None,
    max_missing: int | None,
    max_duplicates: int | None,
    **flags: Any,
) -> None:
    """Verify delivery with Spark: lateness, early, duplicate and missing messages."""
    if report is not None and not once:
        raise click.UsageError("--report needs --once")
    cfg = load(VerifierConfig, flags, config_file)
    logs.configure(cfg.log_level, json=False)
    check_acls(cfg)
    slo = Slo(max_p99_ms, max_early, max_missing, max_duplicates)

    try:
        from kdelay.verifier import job
    except ModuleNotFoundError as exc:
        if exc.name != "pyspark":
            raise
        raise click.ClickException(
            "kdelay verify needs PySpark, which is not installed: "
            "pip install 'kdelay[verifier]' (make install does this)"
        ) from None

    stop = threading.Event()
    metrics = Metrics()
    if not once:
        # Before Spark starts (tens of seconds): a stop signal meanwhile stops the verifier as
        # soon as it runs; a pod's readiness probe reads /metrics, and Spark on Kubernetes waits
        # for its driver pod to be ready before creating executors.
        on_stop_signals(lambda _signum: stop.set())
        if cfg.metrics_port:
            metrics.serve(cfg.metrics_port, cfg.metrics_host)
    spark = job.spark_session(cfg)
    try:
        if once:
            outcome = verify_once(spark, cfg, slo, report)
            click.echo(json.dumps(outcome.report))
            for path in outcome.files[1:]:
                click.echo(f"wrote {path}", err=True)
            for line in outcome.breaches:
                click.echo(line, err=True)
            sys.exit(outcome.exit_code)
        verify_continuous(spark, cfg, stop, metrics)
    finally:
        spark.stop()
