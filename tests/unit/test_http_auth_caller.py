"""proxy/http/auth.py: the caller a route acts for when the API is open or authenticates."""

from __future__ import annotations

import asyncio
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI

from kdelay.proxy.http import errors as http_errors
from kdelay.proxy.http.auth import STATE_AUTHENTICATES, Caller, current_caller
from kdelay.proxy.metrics import ProxyMetrics


def _app() -> FastAPI:
    app = FastAPI()
    http_errors.install(app, ProxyMetrics())

    @app.get("/who")
    async def who(caller: Annotated[Caller, Depends(current_caller)]) -> dict[str, object]:
        return {
            "principal": caller.principal,
            "writable": await caller.writable("t"),
            "admin": await caller.admin(),
        }

    return app


def _get(app: FastAPI, url: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get(url)

    return asyncio.run(go())


def test_an_open_api_acts_for_an_open_caller_allowed_everything() -> None:
    answer = _get(_app(), "/who")
    assert answer.status_code == 200
    assert answer.json() == {"principal": None, "writable": True, "admin": True}


def test_an_authenticating_api_never_falls_back_to_the_open_caller() -> None:
    app = _app()
    setattr(app.state, STATE_AUTHENTICATES, True)
    answer = _get(app, "/who")
    assert answer.status_code == 401
    assert "credentials" in answer.json()["error"]
