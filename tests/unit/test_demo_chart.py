"""The lateness chart ``make demo`` prints (``<stem>.lateness.png``): one point per message.

A 20-s run cut into 10-s windows gave two points joined by a line, which hid the burst and its
tail; plotted message by message against the due time, the picture shows both.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest

from kdelay.verifier import chart
from kdelay.verifier.report import Lateness, Summary, WindowResult

START_MS = 1_700_000_000_000
SVG = "{http://www.w3.org/2000/svg}"


def _burst(n: int = 500, seed: int = 7) -> list[tuple[int, float]]:
    """(due_ms, lateness_ms): a burst due in one second whose lateness grows as the pipeline
    works through it, then a quiet trickle over 20 s; two messages delivered early."""
    rnd = random.Random(seed)
    burst = [(START_MS + rnd.randrange(1000), 0.0) for _ in range(n * 4 // 5)]
    burst = [(due, 5.0 + i * 1.2 + rnd.random()) for i, (due, _) in enumerate(sorted(burst))]
    trickle = [
        (START_MS + 1000 + rnd.randrange(19_000), rnd.uniform(1, 4)) for _ in range(n - len(burst))
    ]
    points = burst + trickle
    points[-1] = (points[-1][0], -3.0)
    points[-2] = (points[-2][0], -1.0)
    return points


def _windows() -> list[WindowResult]:
    """The same run as two 10-s windows: what the chart used to draw."""
    return [
        WindowResult(
            START_MS, START_MS + 10_000, Summary(420, 420, 0, 0, 0, Lateness(6, 400, 470, 490))
        ),
        WindowResult(
            START_MS + 10_000, START_MS + 20_000, Summary(80, 79, 1, 0, 2, Lateness(2, 3, 4, 4))
        ),
    ]


def test_the_chart_plots_one_point_per_message_not_per_window() -> None:
    points = _burst()
    fig = chart.lateness_figure(_windows(), points)
    ax = fig.axes[0]
    [messages] = [c for c in ax.collections if c.get_gid() == chart.MESSAGES_GID]
    offsets = np.asarray(messages.get_offsets(), dtype=float)
    assert offsets.shape == (len(points), 2) == (500, 2)
    # x: the due time as matplotlib date numbers (days); y: the lateness in ms, as given.
    assert sorted(offsets[:, 1].tolist()) == sorted(late for _, late in points)
    first = float(offsets[:, 0].min()) * 86_400_000
    assert first == pytest.approx(min(due for due, _ in points), abs=1)
    # No per-window polyline: the only line is the horizontal zero (early below it).
    lines = [np.asarray(line.get_ydata(), dtype=float).tolist() for line in ax.get_lines()]
    assert lines == [[0.0, 0.0]]
    assert "500 messages" in ax.get_title()
    assert "missing: 1" in ax.get_title()


def test_the_svg_holds_one_marker_per_message() -> None:
    points = _burst()
    buf = BytesIO()
    chart.lateness_figure(_windows(), points).savefig(buf, format="svg")
    root = ET.fromstring(buf.getvalue())  # noqa: S314 - matplotlib's own output
    [group] = [g for g in root.iter(f"{SVG}g") if g.get("id") == chart.MESSAGES_GID]
    assert len(list(group.iter(f"{SVG}use"))) == 500


def test_write_charts_keeps_the_file_names_and_draws_an_empty_run(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    paths = chart.write_charts(_windows(), _burst(), report)
    assert [p.name for p in paths] == ["report.lateness.png", "report.histogram.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    empty = chart.lateness_figure([], [])
    assert not [c for c in empty.axes[0].collections if c.get_gid() == chart.MESSAGES_GID]
    assert chart.write_charts([], [], tmp_path / "empty.json")[0].exists()
