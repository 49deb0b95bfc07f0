"""The HTTP API of a secured proxy fuzzed with schemathesis from its own OpenAPI schema.

Two targets (tests/support/fuzz_targets.py): ``kdelay proxy`` (a process, tests/support/fuzz.py)
serving its API on HTTPS with ``http_auth=kafka`` in front of a real secured Kafka, and the whole
stack of ``kdelay up --secure`` (its proxy the same, with replicas behind it; a fifth of the
examples). schemathesis generates requests for every operation of ``/openapi.json``, valid and
invalid. Without credentials, or with a wrong password carrying a marker, every operation
answers 401 JSON and never echoes the credentials. As alice (a Kafka user allowed to write one
topic) no answer is a server error but, from the lone proxy, 503 naming the setting it runs
without (``zk_connect``: no replicas to ask), and answers conform to the schema where
schemathesis can check. After each run the proxy's process lives, an authenticated POST of a
delayed message is accepted, and the HTTP metric's label values are of closed sets. Seeded
(``derandomize``) and bounded so CI is deterministic; ``KDELAY_FUZZ_SCALE`` multiplies the
examples for a deep run.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, response_schema_conformance

from kdelay.proxy import metric_labels
from tests.support.fuzz import SCALE, SecuredProxy, basic, series
from tests.support.fuzz_targets import TARGETS, fuzz_target

#: Examples per operation.
EXAMPLES = 20 * SCALE
#: Answered without credentials, by design (probes and Prometheus' scrape).
OPEN = {"/healthz", "/readyz", "/metrics"}


def _fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module", params=TARGETS)
def proxy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecuredProxy]:
    target = cast(str, request.param)
    with fuzz_target(target, tmp_path_factory.mktemp(f"fuzz-http-{target}")) as px:
        yield px


@pytest.fixture(scope="module")
def alice(proxy: SecuredProxy) -> str:
    return proxy.basic("alice")


def _call(case: Any, proxy: SecuredProxy, auth: str | None) -> Any:
    """``case`` sent to the proxy, trusting the secured Kafka's CA."""
    headers = {"Authorization": auth} if auth else {}
    return case.call(base_url=proxy.url, headers=headers, timeout=60, verify=str(proxy.ca))


@pytest.fixture(scope="module")
def schema(proxy: SecuredProxy, alice: str) -> Any:
    resp = proxy.http.get(f"{proxy.url}/openapi.json", headers={"authorization": alice})
    assert resp.status_code == 200, resp.text
    return schemathesis.openapi.from_dict(resp.json())


def _operations(schema: Any) -> list[Any]:
    ops = [result.ok() for result in schema.get_all_operations()]
    assert ops, "the schema has no operation"
    return ops


def _cases(operation: Any) -> st.SearchStrategy[Any]:
    return st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )


def _replay(case: Any, resp: Any) -> str:
    return (
        f"{case.method} {case.formatted_path} query={case.query!r} body={case.body!r}: "
        f"{resp.status_code} {resp.text[:500]}"
    )


def _still_serving(proxy: SecuredProxy, alice: str) -> None:
    assert proxy.alive(), proxy.log_tail()
    topic = proxy.users.topic_for("alice", "fuzz-http")
    body = {"topic": topic, "value": "after the fuzzing", "delay_ms": 60_000}
    resp = proxy.http.post(f"{proxy.url}/v1/messages", json=body, headers={"authorization": alice})
    assert resp.status_code == 202, resp.text
    found = series(proxy.metrics(), "kdelay_proxy_http_requests_total")
    methods = {*metric_labels.HTTP_METHODS, metric_labels.OTHER}
    for labels in found["kdelay_proxy_http_requests_total"]:
        assert labels["method"] in methods, labels
        assert labels["route"] == "unmatched" or labels["route"].startswith("/"), labels


def test_every_operation_without_valid_credentials_is_401(
    proxy: SecuredProxy, schema: Any, alice: str
) -> None:
    marker = f"fuzz-{uuid.uuid4().hex}"
    wrong = basic("alice", marker)
    for operation in _operations(schema):
        if operation.path in OPEN:
            continue

        @_fuzz(proxy.examples(EXAMPLES))
        @given(case=_cases(operation), credentials=st.sampled_from([None, wrong]))
        def fuzz(case: Any, credentials: str | None) -> None:
            resp = _call(case, proxy, credentials)
            assert resp.status_code == 401, _replay(case, resp)
            assert resp.headers["content-type"] == ["application/json"], _replay(case, resp)
            assert "error" in resp.json(), _replay(case, resp)
            echoed = resp.text + " ".join(f"{k}: {v}" for k, v in resp.headers.items())
            assert marker not in echoed, _replay(case, resp)
            assert wrong.split()[1] not in echoed, _replay(case, resp)

        fuzz()
    _still_serving(proxy, alice)


def _no_server_error(case: Any, resp: Any) -> None:
    if resp.status_code == 503:  # no replicas configured: the answer names the setting
        assert "zk_connect" in resp.json()["error"], _replay(case, resp)
        return
    assert resp.status_code < 500, _replay(case, resp)


def test_every_operation_as_alice_never_answers_a_server_error(
    proxy: SecuredProxy, schema: Any, alice: str
) -> None:
    proxy.users.topic_for("alice", "fuzz-http-alice")
    statuses: Counter[int] = Counter()
    for operation in _operations(schema):

        @_fuzz(proxy.examples(EXAMPLES))
        @given(case=_cases(operation))
        def fuzz(case: Any) -> None:
            resp = _call(case, proxy, alice)
            _no_server_error(case, resp)
            statuses[resp.status_code] += 1
            if resp.status_code < 500:
                case.validate_response(
                    resp, checks=[response_schema_conformance, content_type_conformance]
                )

        fuzz()
    # Past authentication: the fuzzing reached the operations themselves.
    assert statuses[401] < sum(statuses.values()), statuses
    _still_serving(proxy, alice)


#: Methods as sent on the wire: RFC 9110's, made-up tokens, and odd case.
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get"]) | (
    st.from_regex(r"\A[A-Z]{1,12}\Z")
)
segments = st.lists(st.text(st.characters(codec="utf-8"), max_size=12), max_size=4)
queries = st.dictionaries(st.text(max_size=8), st.text(max_size=16), max_size=3)
bodies = st.none() | st.binary(max_size=256) | st.sampled_from([b"{}", b"null", b'{"topic":'])


def _raw_request(
    proxy: SecuredProxy,
    method: str,
    parts: list[str],
    query: dict[str, str],
    body: bytes | None,
    *,
    auth: str | None,
) -> httpx.Response:
    path = "/v1/" + "/".join(quote(part, safe="") for part in parts)
    headers = {"authorization": auth} if auth else {}
    if body is not None:
        headers["content-type"] = "application/json"
    return proxy.http.request(
        method, f"{proxy.url}{path}", params=query, content=body, headers=headers
    )


def test_made_up_requests_under_v1_are_never_a_server_error(
    proxy: SecuredProxy, alice: str
) -> None:
    """What the schema does not list: any method, any path under /v1, odd queries and bodies.
    Without credentials 401; as alice never a 5xx; the HTTP metric gains no series per path or
    method sent."""
    name = "kdelay_proxy_http_requests_total"
    before = len(series(proxy.metrics(), name)[name])

    @_fuzz(proxy.examples(EXAMPLES * 5))
    @given(methods, segments, queries, bodies, st.booleans())
    def fuzz(
        method: str, parts: list[str], query: dict[str, str], body: bytes | None, as_alice: bool
    ) -> None:
        resp = _raw_request(proxy, method, parts, query, body, auth=alice if as_alice else None)
        seen = f"{method} {resp.request.url} body={body!r}: {resp.status_code} {resp.text[:300]}"
        if as_alice:
            assert resp.status_code < 500, seen
        else:
            assert resp.status_code == 401, seen
            assert alice.split()[1] not in resp.text, seen

    fuzz()
    after = len(series(proxy.metrics(), name)[name])
    # A series per (method label, route, status): a few at most (10 seen), not one a request.
    assert after <= before + 40 * SCALE, (before, after)
    _still_serving(proxy, alice)
