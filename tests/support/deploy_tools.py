"""The deployment tools (helm, kubeconform, promtool, prometheus, compose-check, hadolint).

``ensure_tools`` runs ``dev/tools/install.sh`` once per test session (cached in-process) --
it installs the pinned tools into ``.cache/tools`` (idempotent; the first run builds helm from
source and prints its progress) -- and skips with the installer's own last lines only when it
fails, i.e. when a tool truly cannot be installed here. Test modules wrap it in a ``tools``
fixture (importing a fixture into several modules would trip ruff's F811);
``deploy_tools_session`` is the same as a session fixture, for a conftest that wants it.

The helpers render the chart, validate manifests offline and read the metric names that
docs/metrics.md documents and that PromQL expressions use.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kdelay"
INSTALL = ROOT / "dev" / "tools" / "install.sh"
TOOLS = ROOT / ".cache" / "tools"
#: Kubernetes versions the chart is validated against (install.sh generates their schemas).
K8S_VERSIONS = ("1.29.0", "1.35.0")


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubeconform: Path
    promtool: Path
    prometheus: Path
    compose_check: Path
    hadolint: Path
    k8s_schemas: Path
    crd_schemas: Path


def _tools() -> Tools:
    b = TOOLS / "bin"
    return Tools(
        helm=b / "helm",
        kubeconform=b / "kubeconform",
        promtool=b / "promtool",
        prometheus=b / "prometheus",
        compose_check=b / "compose-check",
        hadolint=b / "hadolint",
        k8s_schemas=TOOLS / "k8s-schemas",
        crd_schemas=TOOLS / "crd-schemas",
    )


@cache
def _install(show_progress: Callable[[], AbstractContextManager[None]]) -> tuple[bool, str]:
    """Run install.sh once per test process (fixtures imported into several modules share it)."""
    with show_progress():
        result = subprocess.run(
            ["bash", str(INSTALL)],
            cwd=ROOT,
            stdout=None,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            timeout=3600,
        )
    return result.returncode == 0, "\n".join(result.stderr.strip().splitlines()[-5:])


def ensure_tools(config: pytest.Config) -> Tools:
    """The installed tools, installing them on first use in this process; skips if impossible.

    Progress goes to the terminal, not to pytest's capture.
    """
    capman = config.pluginmanager.getplugin("capturemanager")
    ok, tail = _install(capman.global_and_fixture_disabled)
    if not ok:
        pytest.skip(f"deploy tools cannot be installed here (dev/tools/install.sh): {tail}")
    return _tools()


# ---- helm ---------------------------------------------------------------------------------------


def run(cmd: list[str | Path], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        cwd=ROOT,
    )


def helm_template_text(
    tools: Tools,
    *,
    values: Iterable[Path] = (),
    sets: dict[str, str] | None = None,
    extra: Iterable[str] = (),
) -> subprocess.CompletedProcess[str]:
    cmd: list[str | Path] = [tools.helm, "template", "kd", CHART, "--namespace", "kdelay"]
    for v in values:
        cmd += ["--values", v]
    for key, value in (sets or {}).items():
        cmd += ["--set", f"{key}={value}"]
    cmd += list(extra)
    return run(cmd)


def helm_template(
    tools: Tools, *, values: Iterable[Path] = (), sets: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Rendered manifests; fails the test with helm's message when rendering fails."""
    result = helm_template_text(tools, values=values, sets=sets)
    assert result.returncode == 0, f"helm template failed:\n{result.stderr}"
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = find(docs, kind, name_suffix)
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {len(found)}"
    return found[0]


def kubeconform(tools: Tools, manifests: str, k8s_version: str) -> subprocess.CompletedProcess[str]:
    """Offline, strict validation: Kubernetes schemas, then the prometheus-operator CRD schemas."""
    return run(
        [
            tools.kubeconform,
            "-strict",
            "-summary",
            "-output",
            "text",
            "-kubernetes-version",
            k8s_version,
            "-schema-location",
            f"{tools.k8s_schemas}/{{{{ .NormalizedKubernetesVersion }}}}-standalone"
            "{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json",
            "-schema-location",
            f"{tools.crd_schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        ],
        stdin=manifests,
    )


# ---- metric names -------------------------------------------------------------------------------

_ROW = re.compile(r"^\|\s*`(kdelay_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|")
_METRIC = re.compile(r"\bkdelay_[a-z0-9_]+")


@cache
def documented_metrics() -> dict[str, str]:
    """name -> type, from the tables of docs/metrics.md."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return {m[1]: m[2] for line in text.splitlines() if (m := _ROW.match(line.strip()))}


def series_names(name: str, kind: str) -> set[str]:
    """The sample names a documented metric exposes."""
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count"}
    return {name}


def allowed_series() -> dict[str, str]:
    """Sample name -> the documented metric it belongs to."""
    return {
        s: name for name, kind in documented_metrics().items() for s in series_names(name, kind)
    }


def metrics_in(expr: str) -> set[str]:
    """kdelay_* names used in a PromQL expression (recording-rule names contain ':', not '_')."""
    no_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(_METRIC.findall(no_strings))


def dashboard_exprs(path: Path) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every target of a dashboard JSON file."""
    board = yaml.safe_load(path.read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def rule_exprs(path: Path) -> Iterator[tuple[str, str]]:
    """(alert or record name, expr) for every rule of a Prometheus rule file."""
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]
