"""The console's files (proxy/http/console.py) and the overview's ``GET /v1/cluster``
(proxy/http/cluster.py): replicas serving a /metrics the test writes, the release rate and the
lateness quantiles over the window, a replica that does not answer, administrators only.
The console in a browser: tests/integration/test_console.py."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI

from dev.stack import free_port
from kdelay.headers import DelayPolicy
from kdelay.proxy.http import cluster as http_cluster
from kdelay.proxy.http.app import create_app
from kdelay.proxy.http.auth import Caller, OpenCaller, current_caller
from kdelay.proxy.http.cluster import ReleaseWindow, Scrape, install_cluster_route, quantile
from kdelay.proxy.http.console import ASSETS, load_assets
from kdelay.proxy.metrics import ProxyMetrics
from kdelay.proxy.routing.topics import Topics
from kdelay.proxy.upstream.producer import Upstream
from kdelay.zk.replica_api import Replica, ReplicaApi

pytestmark = pytest.mark.unit

BOUNDS = (0.1, 0.5, 1.0)


class Fake:
    """Upstream the proxy's app needs to exist; these endpoints never use it."""

    cluster_id = "fake"
    bootstrap = "fake:9092"


class GivenReplicas(ReplicaApi):
    """A ReplicaApi whose replica list is given, not read from ZooKeeper."""

    def __init__(self, *shards: list[Replica]) -> None:
        super().__init__("unused:2181")
        self.given = list(shards)

    def shards(self) -> list[list[Replica]]:
        return self.given


class NotAdmin(OpenCaller):
    async def admin(self) -> bool:
        return False


def exposition(pending: int, forwarded: int, lateness: dict[float, int]) -> str:
    """A replica's /metrics text with the three families the overview reads."""
    lines = [
        "# TYPE kdelay_replica_pending_messages gauge",
        f"kdelay_replica_pending_messages {pending}",
        "# TYPE kdelay_replica_forwarded counter",
        f"kdelay_replica_forwarded_total {forwarded}",
        "# TYPE kdelay_replica_lateness_seconds histogram",
    ]
    total = 0
    for bound in (*BOUNDS, float("inf")):
        total += lateness.get(bound, 0)
        le = "+Inf" if bound == float("inf") else str(bound)
        lines.append(f'kdelay_replica_lateness_seconds_bucket{{le="{le}"}} {total}')
    lines.append(f"kdelay_replica_lateness_seconds_count {total}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def metrics_server(texts: dict[str, str], key: str) -> Iterator[int]:
    """An HTTP server answering GET /metrics with ``texts[key]`` (changed by the test)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = texts[key].encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def get(app: Any, url: str) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get(url)

    return asyncio.run(run())


def proxy_app(replicas: ReplicaApi | None = None) -> Any:
    fake = cast(Upstream, Fake())
    return create_app(Topics(fake), fake, ProxyMetrics(), DelayPolicy(), replicas=replicas)


# -- the console's files ---------------------------------------------------------------------


def test_the_console_is_served_at_ui_with_its_own_files_only() -> None:
    app = proxy_app()
    page = get(app, "/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["cache-control"] == "no-store"
    assert '<script src="/ui/console.js"' in page.text
    redirect = get(app, "/ui")
    assert (redirect.status_code, redirect.headers["location"]) == (308, "/ui/")
    script = get(app, "/ui/console.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert get(app, "/ui/console.css").headers["content-type"].startswith("text/css")
    missing = get(app, "/ui/secrets.txt")
    assert missing.status_code == 404
    assert missing.json()["error"] == "/ui/secrets.txt: the console has no such file"
    assert get(app, "/ui/index.html").status_code == 404  # the page is /ui/


def test_the_console_fetches_nothing_from_elsewhere_and_runs_no_inline_script() -> None:
    files = load_assets()
    assert set(files) == set(ASSETS)
    for name, data in files.items():
        # The SVG namespace is a name, never fetched.
        text = data.decode().replace('"http://www.w3.org/2000/svg"', "SVG_NS")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.IGNORECASE), name
    page = files["index.html"].decode()
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/ui/console.js" defer>']
    assert " on" not in re.sub(r"<script.*?</script>", "", page).replace(" one", "")
    # Values from the API are written as text, never as markup.
    assert "innerHTML" not in files["console.js"].decode()


# -- the overview's figures ------------------------------------------------------------------


def test_quantiles_interpolate_within_buckets_as_prometheus_does() -> None:
    cumulative = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, float("inf"): 100.0}
    assert quantile(0.5, cumulative) == pytest.approx(0.1)
    assert quantile(0.7, cumulative) == pytest.approx(0.1 + 0.4 * (20 / 40))
    assert quantile(0.99, cumulative) == pytest.approx(0.5 + 0.5 * (9 / 10))
    assert quantile(0.25, cumulative) == pytest.approx(0.05)
    # Beyond the last finite bound: that bound, as histogram_quantile answers.
    assert quantile(0.99, {0.1: 1.0, float("inf"): 10.0}) == 0.1
    assert quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert quantile(0.5, {}) is None


def test_the_window_sums_replicas_and_counts_a_restarted_one_from_zero() -> None:
    window = ReleaseWindow(60.0)
    assert window.view().rate_per_s is None
    window.add(0.0, {"a": Scrape(1, 100.0, {1.0: 100.0, float("inf"): 100.0})})
    assert window.view().span_s == 0.0
    window.add(
        10.0,
        {
            "a": Scrape(1, 130.0, {1.0: 130.0, float("inf"): 130.0}),  # +30
            "b": Scrape(1, 20.0, {1.0: 20.0, float("inf"): 20.0}),  # new: +20
        },
    )
    view = window.view()
    assert (view.released, view.rate_per_s, view.span_s) == (50, 5.0, 10.0)
    window.add(20.0, {"a": Scrape(1, 5.0, {1.0: 5.0, float("inf"): 5.0})})  # restarted
    assert window.view().released == 5
    # Samples older than the window go, but two always stay.
    window.add(100.0, {"a": Scrape(1, 15.0, {1.0: 15.0, float("inf"): 15.0})})
    assert [s.at for s in window.samples] == [20.0, 100.0]


def test_the_cluster_view_names_masters_and_measures_releases() -> None:
    texts = {
        "m": exposition(7, 1000, {0.1: 1000}),
        "f": exposition(7, 0, {}),
        "s1": exposition(3, 0, {}),
    }
    clock = [100.0]
    with (
        metrics_server(texts, "m") as m_port,
        metrics_server(texts, "f") as f_port,
        metrics_server(texts, "s1") as s1_port,
    ):
        replicas = GivenReplicas(
            [
                Replica("m", "master", 0, "127.0.0.1", m_port),
                Replica("f", "follower", 4, "127.0.0.1", f_port),
            ],
            [
                Replica("s1", "master", 0, "127.0.0.1", s1_port),
                Replica("gone", "follower", None, "127.0.0.1", free_port()),
            ],
        )
        app = FastAPI()
        install_cluster_route(app, replicas, monotonic=lambda: clock[0], window_s=300.0)
        first = get(app, "/v1/cluster")
        assert first.status_code == 200, first.text
        doc = first.json()
        assert [(s["shard"], s["master"]) for s in doc["shards"]] == [(0, "m"), (1, "s1")]
        rows = {r["name"]: r for s in doc["shards"] for r in s["replicas"]}
        assert {n: (r["role"], r["lag"], r["pending"], r["up"]) for n, r in rows.items()} == {
            "m": ("master", 0, 7, True),
            "f": ("follower", 4, 7, True),
            "s1": ("master", 0, 3, True),
            "gone": ("follower", None, None, False),
        }
        assert "ConnectionRefusedError" in rows["gone"]["error"]
        assert doc["release"]["rate_per_s"] is None  # one sample: not measured yet
        assert doc["release"]["span_s"] == 0.0

        # 20 s later: m released 200 more, 100 of them within 0.1 s, 100 in (0.5, 1]; s1 100.
        texts["m"] = exposition(7, 1200, {0.1: 1100, 1.0: 100})
        texts["s1"] = exposition(3, 100, {0.1: 100})
        clock[0] = 120.0
        release = get(app, "/v1/cluster").json()["release"]
        assert (release["released"], release["rate_per_s"], release["span_s"]) == (300, 15.0, 20.0)
        # 300 released, 200 within 0.1 s: p50 within the first bucket, p99 in (0.5, 1].
        assert release["lateness_p50_s"] == pytest.approx(0.1 * 150 / 200)
        assert release["lateness_p99_s"] == pytest.approx(0.5 + 0.5 * (297 - 200) / 100)

        # Within MIN_SCRAPE_S the last scrape is reused: the figures do not move.
        texts["m"] = exposition(7, 5000, {0.1: 5000})
        clock[0] += http_cluster.MIN_SCRAPE_S / 2
        assert get(app, "/v1/cluster").json()["release"]["released"] == 300


def test_the_cluster_view_is_for_administrators_and_needs_zk_connect() -> None:
    app = proxy_app(None)
    resp = get(app, "/v1/cluster")
    assert resp.status_code == 503
    assert resp.json()["error"].startswith("zk_connect: ")

    def not_admin() -> Caller:
        return NotAdmin()

    app.dependency_overrides[current_caller] = not_admin
    refused = get(app, "/v1/cluster")
    assert refused.status_code == 403
    assert "ALTER on __kdelay_buffer" in refused.json()["error"]
