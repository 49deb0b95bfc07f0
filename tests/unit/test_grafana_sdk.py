"""The dashboards are built with Grafana's own SDK (grafana-foundation-sdk), not written by hand.

The generator's boards are the SDK's typed models, assembled by its builders; everything in the
committed JSON survives a round trip through the SDK's model (a hand-added key, or a panel or
query the schema does not know, would be dropped). The model may add its own empty defaults
(a timeseries' ``fieldConfig.defaults.custom``), which is form, not content.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, prometheus, stat
from grafana_foundation_sdk.models import dashboard as model

from dev.tools.grafana.boards import DASHBOARDS
from dev.tools.grafana.panels import Panel, q
from dev.tools.grafana.render import dashboard, to_json

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "deploy" / "grafana").glob("*.json"))


@pytest.fixture(scope="module", autouse=True)
def _sdk_plugins() -> None:
    """Lets the model decode panel options and queries by their plugin (stat, prometheus)."""
    plugins.register_default_plugins()


def _encoded(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=JSONEncoder))


def _lost(data: Any, kept: Any, where: str = "") -> list[str]:
    """Where ``data`` holds something ``kept`` does not (``kept`` may add keys)."""
    if isinstance(data, dict) and isinstance(kept, dict):
        return [
            lost
            for key, value in data.items()
            for lost in (
                _lost(value, kept[key], f"{where}.{key}") if key in kept else [f"{where}.{key}"]
            )
        ]
    if isinstance(data, list) and isinstance(kept, list) and len(data) == len(kept):
        return [
            lost
            for i, pair in enumerate(zip(data, kept, strict=True))
            for lost in _lost(*pair, f"{where}[{i}]")
        ]
    return [] if data == kept else [f"{where}: {data!r} != {kept!r}"]


def test_every_board_is_an_sdk_dashboard_of_sdk_panels_and_prometheus_queries() -> None:
    assert sorted(DASHBOARDS) == [p.name for p in FILES]
    for name, board in DASHBOARDS.items():
        assert isinstance(board, model.Dashboard), name
        assert board.panels, name
        for panel in board.panels:
            assert isinstance(panel, model.Panel), (name, panel)
            assert panel.targets, (name, panel.title)
            for target in panel.targets:
                assert isinstance(target, prometheus.Dataquery), (name, panel.title)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_committed_json_round_trips_through_the_sdk_model(path: Path) -> None:
    data = json.loads(path.read_text())
    decoded = model.Dashboard.from_json(data)
    assert not _lost(data, _encoded(decoded))
    for panel in decoded.panels or []:
        assert isinstance(panel, model.Panel), path.name
        for target in panel.targets or []:
            assert isinstance(target, prometheus.Dataquery), (path.name, panel.title)


def test_render_builds_typed_panels_laid_out_by_the_sdk() -> None:
    panels = [
        Panel("rate", [q("sum(rate(kdelay_proxy_records_total[5m]))", "records")], "rps"),
        Panel(
            "master",
            [q("kdelay_replica_is_master", "{{instance}}")],
            "none",
            kind="stat",
            width=6,
            show_name=True,
        ),
        Panel("due", [q("kdelay_replica_due_messages")], kind="bargauge", width=6),
        Panel("wide", [q("kdelay_replica_pending_messages")]),
    ]
    board = dashboard("uid-x", "kdelay / X", panels, "why")
    encoded = _encoded(board)
    assert encoded == json.loads(to_json(board))
    assert [p["type"] for p in encoded["panels"]] == [
        "timeseries",
        "stat",
        "bargauge",
        "timeseries",
    ]
    assert [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in encoded["panels"]] == [
        (0, 0),
        (12, 0),
        (18, 0),
        (0, 8),
    ]
    assert [p["id"] for p in encoded["panels"]] == [1, 2, 3, 4]
    master = (board.panels or [])[1]
    assert isinstance(master, model.Panel)
    assert isinstance(master.options, stat.Options)
    assert master.options.text_mode == common.BigValueTextMode.NAME
    assert master.options.color_mode == common.BigValueColorMode.BACKGROUND
    target = encoded["panels"][0]["targets"][0]
    assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert (target["refId"], target["legendFormat"], target["range"]) == ("A", "records", True)
    assert encoded["panels"][2]["targets"][0]["legendFormat"] == "__auto"


def test_round_trip_drops_what_the_schema_does_not_know() -> None:
    """The round trip above has teeth: a misspelt query field or panel option is lost."""
    data = json.loads(FILES[0].read_text())
    data["panels"][0]["targets"][0]["exprr"] = "up"
    data["panels"][0]["options"] = {"bogusOption": 1}
    lost = _lost(data, _encoded(model.Dashboard.from_json(data)))
    assert sorted(lost) == [".panels[0].options.bogusOption", ".panels[0].targets[0].exprr"]


def test_an_unknown_panel_kind_names_the_panel() -> None:
    with pytest.raises(ValueError, match="'odd': kind 'piechart'"):
        dashboard("u", "t", [Panel("odd", [q("up")], kind="piechart")], "")
