"""Charts of a ``--once`` run: every message's lateness by due time, and a lateness histogram.

The lateness chart plots one point per delivered message (up to the job's chart sample) at its
due time: a burst shows as a column and its tail as the points climbing above it, which per-window
percentiles (two points for a 20-s demo in 10-s windows) hide. matplotlib's object API with the
Agg canvas: no pyplot global state, no display needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kdelay.verifier.report import WindowResult

_DAY_MS = 86_400_000
#: The id of the messages' scatter in the figure (and of its group in an SVG rendering).
MESSAGES_GID = "messages"
#: (due time in ms since the epoch, lateness in ms) of one delivered message.
Point = tuple[int, float]


def chart_paths(report: Path) -> tuple[Path, Path]:
    """The PNGs next to ``report``: ``<stem>.lateness.png`` and ``<stem>.histogram.png``."""
    return (
        report.with_name(f"{report.stem}.lateness.png"),
        report.with_name(f"{report.stem}.histogram.png"),
    )


def lateness_figure(windows: Sequence[WindowResult], points: Sequence[Point]) -> Figure:
    """Each message's lateness (ms) against its due time (UTC); the missing count is taken from
    ``windows``. Early deliveries are the points below the zero line."""
    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if points:
        # matplotlib's date numbers: days since its epoch, 1970-01-01 by default.
        x = [due / _DAY_MS for due, _ in points]
        y = [late for _, late in points]
        ax.scatter(x, y, s=6, alpha=0.5, linewidths=0, gid=MESSAGES_GID)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.xaxis_date(tz=UTC)
        fig.autofmt_xdate()
    else:
        ax.text(0.5, 0.5, "no deliveries", ha="center", va="center", transform=ax.transAxes)
    missing = sum(w.summary.missing for w in windows)
    ax.set_title(f"kdelay lateness by due time ({len(points)} messages, missing: {missing})")
    ax.set_xlabel("due time (UTC)")
    ax.set_ylabel("lateness (ms)")
    ax.grid(visible=True, alpha=0.3)
    fig.tight_layout()
    return fig


def lateness_over_time(
    windows: Sequence[WindowResult], points: Sequence[Point], path: Path
) -> Path:
    """:func:`lateness_figure` as a PNG at ``path``."""
    lateness_figure(windows, points).savefig(path, format="png")
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
    windows: Sequence[WindowResult], points: Sequence[Point], report: Path
) -> tuple[Path, Path]:
    """Both charts next to ``report`` from the messages' (due, lateness) ``points``; returns
    their paths."""
    over_time, histogram = chart_paths(report)
    lateness_ms = [late for _, late in points]
    return (
        lateness_over_time(windows, points, over_time),
        lateness_histogram(lateness_ms, histogram),
    )
