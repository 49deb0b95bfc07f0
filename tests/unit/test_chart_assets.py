"""The chart's files, dashboards and rules agree with their sources and with docs/metrics.md.

No tools needed: these read files only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy_tools import (
    CHART,
    ROOT,
    allowed_series,
    dashboard_exprs,
    documented_metrics,
    metrics_in,
    rule_exprs,
)

GRAFANA = ROOT / "deploy" / "grafana"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))


def _load_tool(name: str) -> Any:
    import importlib.util
    import sys

    qualified = f"kdelay_deploy_tools_{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    path = ROOT / "dev" / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(qualified, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_chart_files_are_identical_to_their_sources() -> None:
    copies = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert [p.name for p in copies] == [p.name for p in DASHBOARDS]
    for copy in copies:
        assert copy.read_bytes() == (GRAFANA / copy.name).read_bytes(), copy.name
    assert (CHART / "files" / "rules.yml").read_bytes() == RULES.read_bytes()


def test_dashboards_match_their_generator() -> None:
    assert _load_tool("dashboards").main(["--check"]) == 0


def test_chart_readme_values_table_is_current_and_complete() -> None:
    assert _load_tool("chart_readme").main(["--check"]) == 0


def test_documented_metrics_table_is_parsed() -> None:
    metrics = documented_metrics()
    assert metrics["kdelay_replica_lateness_seconds"] == "histogram"
    assert metrics["kdelay_proxy_requests_total"] == "counter"
    assert len(metrics) >= 25


def test_metric_extraction_sees_names_and_ignores_strings() -> None:
    expr = 'sum(rate(kdelay_proxy_records_total{kind="kdelay_fake"}[5m])) / kdelay:x:rate5m'
    assert metrics_in(expr) == {"kdelay_proxy_records_total"}
    assert "kdelay_proxy_bogus_total" not in allowed_series()


@pytest.mark.parametrize("path", [*DASHBOARDS, RULES], ids=lambda p: p.name)
def test_every_metric_used_is_documented(path: Path) -> None:
    exprs = list(dashboard_exprs(path) if path.suffix == ".json" else rule_exprs(path))
    assert exprs
    allowed = allowed_series()
    for title, expr in exprs:
        used = metrics_in(expr)
        if not used:
            assert path == RULES, f"{title}: no metric in {expr}"
            assert re.search(r"\bkdelay:", expr), f"{title}: no metric in {expr}"
        unknown = used - allowed.keys()
        assert not unknown, f"{path.name} / {title}: {sorted(unknown)} not in docs/metrics.md"


def test_every_documented_replica_and_proxy_metric_is_on_a_dashboard() -> None:
    used = {
        allowed_series()[m]
        for p in DASHBOARDS
        for _, e in dashboard_exprs(p)
        for m in metrics_in(e)
    }
    missing = {
        m for m in documented_metrics() if m.startswith(("kdelay_proxy_", "kdelay_replica_"))
    } - used
    assert not missing, f"documented but on no dashboard: {sorted(missing)}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    board = json.loads(path.read_text())
    assert board["schemaVersion"] >= 36
    assert 0 < len(board["uid"]) <= 40
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids)) == 3


def _anchors(markdown: str) -> set[str]:
    """GitHub-style heading anchors."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_alerts_have_severity_annotations_and_a_runbook_section() -> None:
    anchors = _anchors(OPERATIONS.read_text())
    alerts = [
        r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    required = {
        "KdelayNoMaster",
        "KdelayCheckpointTooOld",
        "KdelayLatenessHigh",
        "KdelayReplicaLagging",
        "KdelayDeadLetters",
        "KdelayProxyUpstreamErrors",
    }
    assert required <= {a["alert"] for a in alerts}
    for alert in alerts:
        assert alert["labels"]["severity"] in {"warning", "critical"}, alert["alert"]
        annotations = alert["annotations"]
        assert annotations["summary"], alert["alert"]
        assert annotations["description"], alert["alert"]
        url = annotations["runbook_url"]
        assert url == f"docs/operations.md#{alert['alert'].lower()}", url
        assert url.split("#")[1] in anchors, f"docs/operations.md has no section {alert['alert']}"


def test_every_alert_has_a_firing_unit_test() -> None:
    tests = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.test.yml").read_text())
    firing = {
        case["alertname"]
        for t in tests["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {
        r["alert"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert alerts == firing


def test_every_value_has_a_schema_entry() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: Any, sch: dict[str, Any], path: str) -> None:
        if not isinstance(node, dict) or "properties" not in sch:
            return
        for key, value in node.items():
            assert key in sch["properties"], f"{path}{key} is not in values.schema.json"
            walk(value, sch["properties"][key], f"{path}{key}.")

    walk(values, schema, "")
