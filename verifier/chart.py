"""Charts of a ``--once`` run: lateness over time (per window) and a lateness histogram.

matplotlib's object API with the Agg canvas: no pyplot global state, no display needed.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from verifier.report import WindowResult

_DAY_MS = 86_400_000


def chart_paths(report: Path) -> tuple[Path, Path]:
    """The PNGs next to ``report``: ``<stem>.lateness.png`` and ``<stem>.histogram.png``."""
    return (
        report.with_name(f"{report.stem}.lateness.png"),
        report.with_name(f"{report.stem}.histogram.png"),
    )


def lateness_over_time(windows: list[WindowResult], path: Path) -> Path:
    """Per-window p50/p95/p99/max lateness (ms) against the window start (UTC)."""
    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    shown = [w for w in windows if w.summary.delivered > 0]
    if shown:
        # matplotlib's date numbers: days since its epoch, 1970-01-01 by default.
        x = [w.start_ms / _DAY_MS for w in shown]
        for label, values in (
            ("p50", [w.summary.lateness.p50 for w in shown]),
            ("p95", [w.summary.lateness.p95 for w in shown]),
            ("p99", [w.summary.lateness.p99 for w in shown]),
            ("max", [w.summary.lateness.max for w in shown]),
        ):
            ax.plot(x, values, marker=".", label=label)
        ax.legend(loc="upper left")
        ax.xaxis_date(tz=UTC)
        fig.autofmt_xdate()
    else:
        ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)
    missing = sum(w.summary.missing for w in windows)
    ax.set_title(f"kdelay lateness per window (missing: {missing})")
    ax.set_xlabel("window start (due time, UTC)")
    ax.set_ylabel("lateness (ms)")
    ax.grid(visible=True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def lateness_histogram(lateness_ms: list[float], path: Path, bins: int = 50) -> Path:
    """A histogram of per-message lateness (ms); early deliveries are the negative values."""
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if lateness_ms:
        ax.hist(lateness_ms, bins=bins)
    else:
        ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"kdelay lateness histogram ({len(lateness_ms)} messages)")
    ax.set_xlabel("lateness (ms)")
    ax.set_ylabel("messages")
    ax.grid(visible=True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def write_charts(
    windows: list[WindowResult], lateness_ms: list[float], report: Path
) -> tuple[Path, Path]:
    """Both charts next to ``report``; returns their paths."""
    over_time, histogram = chart_paths(report)
    return lateness_over_time(windows, over_time), lateness_histogram(lateness_ms, histogram)
