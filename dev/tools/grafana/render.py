"""A panel list laid out on Grafana's 24-column grid and rendered as a dashboard's JSON model.

Grafana 10+, schemaVersion 39, the Prometheus data source chosen through the ``datasource``
template variable, so the same file works for provisioning, the Grafana sidecar and manual import.
"""

from __future__ import annotations

from typing import Any

from dev.tools.grafana.panels import Panel

DS = {"type": "prometheus", "uid": "${datasource}"}


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": dict(panel.options),
        "targets": [
            {
                "datasource": DS,
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend or "__auto",
                "range": True,
            }
            for i, (expr, legend) in enumerate(panel.targets)
        ],
    }
    if panel.kind == "stat":
        out["options"].setdefault("reduceOptions", {"calcs": ["lastNotNull"], "values": False})
    return out


def dashboard(uid: str, title: str, panels: list[Panel], description: str) -> dict[str, Any]:
    rendered, x, y = [], 0, 0
    for pid, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        rendered.append(_panel(panel, pid, x, y))
        x += panel.width
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["kdelay"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "links": [
            {"type": "dashboards", "tags": ["kdelay"], "asDropdown": True, "title": "kdelay"}
        ],
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                }
            ]
        },
        "panels": rendered,
    }
