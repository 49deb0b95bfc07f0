"""`kdelay cancel --wait S ID` as CONTRACT.md v3 writes it: without --http it finds the proxy's
HTTP API in $KDELAY_HTTP or in kdelay up's state file (.kdelay/up.json) of the current
directory."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdelay.proxy.client import cancel_command

pytestmark = pytest.mark.unit


class _Proxy(BaseHTTPRequestHandler):
    """A stand-in for the proxy's HTTP API: every DELETE is cancelled; it records the paths."""

    paths: list[str] = []  # noqa: RUF012 - one test server at a time

    def do_DELETE(self) -> None:
        _Proxy.paths.append(self.path)
        body = json.dumps({"id": self.path.rsplit("/", 1)[-1].split("?")[0], "state": "cancelled"})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_args: object) -> None:
        return


@pytest.fixture
def http_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Proxy.paths = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_wait_without_http_uses_kdelay_ups_state_file(
    http_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KDELAY_HTTP", raising=False)
    (tmp_path / ".kdelay").mkdir()
    (tmp_path / ".kdelay" / "up.json").write_text(json.dumps({"http": http_api}))
    result = CliRunner().invoke(cancel_command, ["--wait", "5", "order-42"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"id": "order-42", "state": "cancelled"}
    assert _Proxy.paths == ["/v1/messages/order-42?wait=5"]


def test_prefix_without_http_uses_the_environment(
    http_api: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KDELAY_HTTP", http_api)
    result = CliRunner().invoke(cancel_command, ["--prefix", "cust-42-"])
    assert result.exit_code == 0, result.output
    assert _Proxy.paths == ["/v1/messages?id_prefix=cust-42-"]


def test_wait_without_any_http_api_names_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KDELAY_HTTP", raising=False)
    result = CliRunner().invoke(cancel_command, ["--wait", "5", "order-42"])
    assert result.exit_code == 2
    assert "KDELAY_HTTP" in result.output
    assert ".kdelay/up.json" in result.output
