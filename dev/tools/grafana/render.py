"""A panel list built into a dashboard with Grafana's own SDK (grafana-foundation-sdk).

The SDK's builders are typed against Grafana's schema (the pinned release targets Grafana 11.6,
the image deploy/ runs), so a misspelt option or a panel field Grafana does not know is a type
error here instead of a key Grafana silently ignores; its ``Dashboard`` builder lays the panels
out on the 24-column grid. The Prometheus data source is chosen through the ``datasource``
template variable, so the same file works for provisioning, the Grafana sidecar and manual import.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from dev.tools.grafana.panels import Panel

DS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
HEIGHT = 8

PanelBuilder = timeseries.Panel | stat.Panel | bargauge.Panel
KINDS: dict[str, Callable[[], PanelBuilder]] = {
    "timeseries": timeseries.Panel,
    "stat": stat.Panel,
    "bargauge": bargauge.Panel,
}


def _query(ref: int, expr: str, legend: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .datasource(DS)
        .ref_id(chr(ord("A") + ref))
        .expr(expr)
        .legend_format(legend or "__auto")
        .range()
    )


def _panel(panel: Panel, pid: int) -> PanelBuilder:
    if panel.kind not in KINDS:
        raise ValueError(
            f"panel {panel.title!r}: kind {panel.kind!r} is not one of {sorted(KINDS)}"
        )
    built = KINDS[panel.kind]()
    built.id(pid).title(panel.title).datasource(DS).height(HEIGHT).span(panel.width)
    built.unit(panel.unit)
    if panel.description:
        built.description(panel.description)
    for ref, (expr, legend) in enumerate(panel.targets):
        built.with_target(_query(ref, expr, legend))
    if isinstance(built, stat.Panel):
        # The latest value, not a sum over the range: these stats are gauges.
        built.reduce_options(
            common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
        )
        if panel.show_name:
            built.text_mode(common.BigValueTextMode.NAME)
            built.color_mode(common.BigValueColorMode.BACKGROUND)
    elif panel.show_name:
        raise ValueError(f"panel {panel.title!r}: show_name is for stat panels only")
    return built


def dashboard(uid: str, title: str, panels: list[Panel], description: str) -> model.Dashboard:
    """The dashboard ``uid``: ``panels`` in order, left to right, wrapping at 24 columns."""
    board = (
        builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["kdelay"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("")
        .link(
            builders.DashboardLink("kdelay")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(["kdelay"])
            .as_dropdown(True)
        )
        .with_variable(
            builders.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .hide(model.VariableHide.DONT_HIDE)
        )
    )
    for pid, panel in enumerate(panels, start=1):
        board.with_panel(_panel(panel, pid))
    return board.build()


def to_json(board: model.Dashboard) -> str:
    """The dashboard's JSON model as committed under deploy/grafana (the SDK's encoding)."""
    return json.dumps(board, cls=JSONEncoder, indent=2) + "\n"
