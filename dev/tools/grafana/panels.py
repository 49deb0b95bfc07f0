"""The dashboard panel model and the PromQL target builders the panel lists are written with.

Every expression uses only metric names from docs/metrics.md (a test checks). Error targets
(:func:`errs`) add ``or vector(0)``: no child exists before the first error.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE = "$__rate_interval"
MASTER = "on (instance) (kdelay_replica_is_master == 1)"


def per_shard(metric: str) -> str:
    """``metric`` labelled with each replica's shard (kdelay_replica_shard_info); replicas that
    do not export it (one shard, older versions) keep theirs without."""
    info = "kdelay_replica_shard_info"
    return (
        f"({metric} * on (instance, job) group_left (shard) {info} or on (instance, job) {metric})"
    )


@dataclass(frozen=True)
class Panel:
    """One panel as the boards write it; :mod:`dev.tools.grafana.render` turns it into the SDK's
    typed panel. ``kind`` is a panel plugin the renderer knows (timeseries, stat, bargauge);
    ``show_name`` makes a stat show its series' name on a coloured background instead of a
    number (which replica is master)."""

    title: str
    targets: list[tuple[str, str]]  # (expr, legend)
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12
    show_name: bool = False


def q(expr: str, legend: str = "") -> tuple[str, str]:
    return (expr, legend)


def by(metric: str, *labels: str, fn: str = "rate", legend: str = "") -> tuple[str, str]:
    """``fn`` of ``metric`` summed by ``labels``, the labels as the legend unless given."""
    legend = legend or " ".join("{{" + label + "}}" for label in labels)
    return q(f"sum by ({', '.join(labels)}) ({fn}({metric}[{RATE}]))", legend)


def errs(metric: str, *labels: str, fn: str = "rate", legend: str = "") -> tuple[str, str]:
    """:func:`by` for errors, absent in a healthy system: 0 rather than "No data"."""
    expr, legend = by(metric, *labels, fn=fn, legend=legend)
    return q(expr + " or vector(0)", legend)


def total(metric: str, legend: str) -> tuple[str, str]:
    """The rate of ``metric`` summed over everything, 0 while no child exists yet."""
    return q(f"sum(rate({metric}[{RATE}])) or vector(0)", legend)


def lateness(metric: str) -> list[tuple[str, str]]:
    return [
        q(
            f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket[{RATE}])))",
            f"p{round(p * 100)}",
        )
        for p in (0.5, 0.99)
    ]
