"""The operator's console (/ui/, proxy/http/console.py) in a real headless Chromium (Debian's,
driven by Selenium through chromedriver: tests/support/browser.py) against a real proxy and two real
replicas (tests/support/console_stack.py): the overview names the master and shows the release rate
and lateness of messages just delivered; the pending page lists a prefix's messages page by page
with their counts drawn per due-time bucket; a message is looked up and replaced with a new due
time. With authentication on (``http_auth=kafka``, Basic against a SASL Kafka), the page without
credentials is 401, a non-administrator's overview says 403, an administrator's passes, also when
the browser holds the credentials for the realm (a page opened as ``http://user:password@host/ui/``,
as after its prompt: the page's calls must not carry them). Cancel and bulk cancel:
tests/integration/test_console_cancel.py. Each page's screenshot is saved (docs/console/ with
``make console-screenshots``).
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from dev.stack import wait_until
from kdelay import buffer
from kdelay.proxy import running_proxy
from kdelay.proxy.http.cluster import ClusterView
from tests.support.browser import (
    attributes,
    chromium,
    fill,
    find,
    find_all,
    screenshots_dir,
    statuses,
    text,
    wait_for,
)
from tests.support.console_stack import MIN, ConsoleStack, console_stack, now_ms
from tests.support.infra import KafkaInfra, ZooKeeperInfra
from tests.support.secure_kafka import secured_kafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleStack]:
    base = tmp_path_factory.mktemp("console")
    with console_stack(base, kafka.bootstrap_servers, zookeeper.connect) as s:
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshots_dir(tmp_path_factory.mktemp("shots"))


def shoot(driver: WebDriver, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def go(driver: WebDriver, stack: ConsoleStack, page: str) -> None:
    driver.get(f"{stack.ui}#/{page}")
    wait_for(driver, f"the {page} page", lambda d: find(d, f"#{page}").is_displayed())


def test_the_overview_names_the_master_and_measures_releases(
    stack: ConsoleStack, browser: WebDriver, shots: Path
) -> None:
    master = stack.rs.master()
    assert master is not None
    go(browser, stack, "overview")
    wait_for(
        browser,
        "the master's row",
        lambda d: any(
            r.get_attribute("data-replica") == master and "master" in r.text
            for r in find_all(d, "#shards tbody tr")
        ),
    )

    def every_replica_up(d: WebDriver) -> bool:
        rows = rows_text(d)
        return set(rows) == set(stack.rs.replicas) and all(
            line.endswith(" up") for line in rows.values()
        )

    # A replica whose /metrics did not answer in time shows "down" until the next refresh.
    wait_for(browser, "every replica up", every_replica_up)
    assert f"shard 0: {master}" in text(browser, "#overview-as-of")
    # The page's first call was the first sample; messages delivered since show on a refresh.
    ids = [f"overview-{uuid.uuid4().hex[:8]}-{i}" for i in range(10)]
    for msg_id in ids:
        stack.post(msg_id, now_ms() + 500)
    for msg_id in ids:
        stack.wait_state(msg_id, "delivered")

    def released(d: WebDriver) -> bool:
        shown = text(d, "#released")
        return shown.isdigit() and int(shown) >= len(ids)

    wait_for(browser, f"at least {len(ids)} released", released, timeout=90)
    assert re.fullmatch(r"[0-9.]+/s", text(browser, "#rate")), text(browser, "#rate")
    assert re.fullmatch(r"[0-9.]+ (ms|s)", text(browser, "#p50")), text(browser, "#p50")
    assert re.fullmatch(r"[0-9.]+ (ms|s)", text(browser, "#p99")), text(browser, "#p99")
    assert "Releases over the last" in text(browser, "#release-span")
    shoot(browser, shots, "overview")


def test_the_pending_page_lists_a_prefix_page_by_page_and_charts_the_counts(
    stack: ConsoleStack, browser: WebDriver, shots: Path
) -> None:
    topic = stack.new_topic("console-browse")
    prefix = f"order-{uuid.uuid4().hex[:6]}-"
    start = now_ms()
    mine = [f"{prefix}{i:02d}" for i in range(7)]
    for i, msg_id in enumerate(mine):
        stack.post(msg_id, start + (10 + 6 * i) * MIN, topic)
    others = [f"other-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    for msg_id in others:
        stack.post(msg_id, start + 20 * MIN, topic)
    stack.post(f"{prefix}late", start + 3 * 60 * MIN, topic)  # beyond the 1 h window
    for msg_id in [*mine, *others]:
        stack.wait_state(msg_id, "pending")

    go(browser, stack, "pending")
    Select(find(browser, "#f-window")).select_by_value("1h")
    fill(browser, "#f-topic", topic)
    fill(browser, "#f-prefix", prefix)
    fill(browser, "#f-limit", "5")
    find(browser, "#f-apply").click()

    def listed(d: WebDriver) -> list[str]:
        return attributes(d, "#pending-table tbody tr", "data-id")

    wait_for(browser, "the first page", lambda d: listed(d) == mine[:5])
    assert find(browser, "#page-next").is_enabled()
    assert not find(browser, "#page-prev").is_enabled()
    assert find(browser, "#bulk-cancel").is_enabled()  # a prefix is given

    # The chart counts the same filter's messages due within the hour: the prefix's 7.
    def charted(d: WebDriver) -> int:
        return sum(int(c or 0) for c in attributes(d, "#pending-chart rect.bar", "data-count"))

    wait_for(browser, "7 messages charted", lambda d: charted(d) == 7)
    caption = text(browser, "#chart-caption")
    assert f"7 pending for {topic} whose id starts with {prefix} due within 1h" in caption
    heights = [int(c) for c in attributes(browser, "#pending-chart rect.bar", "data-count")]
    assert heights[0] == 0, "nothing of this topic is overdue"
    shoot(browser, shots, "pending")

    find(browser, "#page-next").click()
    wait_for(browser, "the second page", lambda d: listed(d) == mine[5:])
    assert not find(browser, "#page-next").is_enabled()
    assert find(browser, "#page-prev").is_enabled()
    find(browser, "#page-prev").click()
    wait_for(browser, "the first page again", lambda d: listed(d) == mine[:5])
    # A row opens its message.
    find(browser, "#pending-table tbody tr a").click()
    wait_for(browser, "the first message", lambda d: text(d, "td[data-field=id]") == mine[0])


def test_a_message_is_looked_up_and_replaced_with_a_new_due_time(
    stack: ConsoleStack, browser: WebDriver, shots: Path
) -> None:
    msg_id = f"lookup-{uuid.uuid4().hex[:8]}"
    due = (now_ms() // 1000 + 1800) * 1000
    stack.post(msg_id, due, key="customer-42", partition=1)
    stack.wait_state(msg_id, "pending")

    go(browser, stack, "message")
    assert not find(browser, "#m-body").is_displayed()  # no message yet, not the last one shown
    fill(browser, "#m-id", msg_id)
    find(browser, "#m-go").click()
    wait_for(browser, "the message", lambda d: text(d, "td[data-field=id]") == msg_id)
    assert text(browser, "td[data-field=state]") == "pending"
    assert text(browser, "td[data-field=due]").startswith(rfc3339(due))
    assert text(browser, "td[data-field=target]") == f"{stack.topic}, partition 1"
    assert f"pending: due {rfc3339(due)}" in text(browser, "#m-history")
    assert "accepted at " in text(browser, "#m-history")
    assert text(browser, "#m-missing") == ""
    assert browser.current_url.endswith(f"#/message/{msg_id}")
    shoot(browser, shots, "message")

    fill(browser, "#r-due", "+2h")
    fill(browser, "#r-value", "v2")
    find(browser, "#r-go").click()
    wait_for(browser, "the replacement", lambda d: text(d, "#m-result").startswith("Replaced: "))
    wait_until(
        lambda: (stack.status(msg_id).get("deliver_at") or 0) > due + 60 * MIN,
        timeout=60,
        what=f"{msg_id} due about 2 h from now",
        interval=0.1,
    )
    assert stack.status(msg_id)["partition"] == 1

    # A delivered message: its release and lateness in the history, nothing left to cancel.
    done = f"lookup-done-{uuid.uuid4().hex[:8]}"
    stack.post(done, now_ms() + 200)
    released = stack.wait_state(done, "delivered")["released_at"]
    fill(browser, "#m-id", done)
    find(browser, "#m-go").click()
    wait_for(browser, "the delivered one", lambda d: text(d, "td[data-field=id]") == done)
    assert text(browser, "td[data-field=state]") == "delivered"
    assert f"released at {rfc3339(released)} (lateness " in text(browser, "#m-history")
    assert "accepted at " in text(browser, "#m-history")
    assert not find(browser, "#m-cancel").is_enabled()
    shoot(browser, shots, "message-delivered")


def notice_is(start: str) -> Callable[[WebDriver], bool]:
    return lambda d: text(d, "#notice").startswith(start)


def rows_text(d: WebDriver) -> dict[str, str]:
    """Each replica's row of the overview's table, its cells joined by spaces (read at once)."""
    found = d.execute_script(
        "return Array.from(document.querySelectorAll('#shards tbody tr'),"
        " (r) => [r.dataset.replica || '', Array.from(r.cells, (c) => c.textContent).join(' ')]);"
    )
    return {str(name): str(line) for name, line in found}


def rows_say(words: str) -> Callable[[WebDriver], bool]:
    return lambda d: words in text(d, "#shards tbody")


def rfc3339(ms: int) -> str:
    """The console's form of a time: RFC 3339 UTC, milliseconds unless there are none."""
    at = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    return at.replace("+00:00", "Z").replace(".000Z", "Z")


def test_with_authentication_the_page_needs_credentials_and_the_overview_an_administrator(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: ZooKeeperInfra
) -> None:
    """``http_auth=kafka`` (Basic against a SASL Kafka): 401 without credentials, in the browser
    too; alice (no ALTER on the buffer topic) loads the page and its overview says 403; carol,
    an administrator, gets past the check (to the replicas: none is registered here)."""
    base = tmp_path_factory.mktemp("console-auth")
    with secured_kafka(base, "SASL_PLAINTEXT") as secure:
        secure.grant("carol", buffer.BUFFER_TOPIC, "ALTER")
        root = f"/kdelay-test/console-{uuid.uuid4().hex[:8]}"
        config = secure.proxy_config(
            zk_connect=zookeeper.connect,
            zk_root=root,
            http_auth="kafka",
            http_allow_plaintext_auth=True,
        )
        with running_proxy(config) as px:
            assert px.addresses is not None
            url = px.addresses.http
            bare = httpx.get(f"{url}/ui/", timeout=30)
            assert bare.status_code == 401
            assert bare.headers["www-authenticate"].startswith('Basic realm="kdelay"')
            with chromium(base / "profile-none") as driver:
                driver.get(f"{url}/ui/")
                assert statuses(driver).get(f"{url}/ui/") == 401
                assert not find_all(driver, "#overview")  # no console without credentials
            for user in ("alice", "carol"):
                with chromium(base / f"profile-{user}") as driver:
                    # Every request of the page carries the header, as after a browser's prompt.
                    pair = f"{user}:{secure.password(user)}".encode()
                    header = "Basic " + base64.b64encode(pair).decode()
                    driver.execute_cdp_cmd("Network.enable", {})
                    driver.execute_cdp_cmd(
                        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": header}}
                    )
                    driver.get(f"{url}/ui/#/overview")
                    if user == "alice":
                        refused = "Overview: HTTP 403: the cluster overview"
                        wait_for(driver, "alice's 403", notice_is(refused))
                    else:  # an administrator: past the check, to the (absent) replicas
                        wait_for(driver, "carol's overview", rows_say("no replica registered"))
                        assert text(driver, "#notice") == ""
                    assert statuses(driver).get(f"{url}/ui/") == 200
            # As after the browser's prompt: the page's answer challenges, the browser answers
            # with the credentials it holds for the realm, and the page's own calls reuse them.
            with chromium(base / "profile-prompt") as driver:
                host = url.removeprefix("http://")
                driver.get(f"http://carol:{secure.password('carol')}@{host}/ui/#/overview")
                wait_for(driver, "carol's overview", rows_say("no replica registered"))
                # (Not printed: the page's own URLs carry the password.)
                assert statuses(driver).get(f"{url}/v1/cluster") == 200


def test_the_openapi_document_describes_the_cluster_answer(stack: ConsoleStack) -> None:
    """schemathesis on ``GET /v1/cluster`` with replicas answering: the answer is the one the
    OpenAPI document describes (ClusterView), each replica listed with its figures."""
    schema = schemathesis.openapi.from_url(f"{stack.base}/openapi.json")
    (operation,) = [
        r.ok()  # type: ignore[union-attr]
        for r in schema.get_all_operations()
        if r.ok().path == "/v1/cluster"  # type: ignore[union-attr]
    ]

    @given(case=operation.as_strategy())
    @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(case: schemathesis.Case[Any]) -> None:
        case.call_and_validate(base_url=stack.base)

    check()
    doc = ClusterView.model_validate(stack.http.get("/v1/cluster").json())
    assert {r.name for s in doc.shards for r in s.replicas} == set(stack.rs.replicas)
    assert all(r.up and r.pending is not None for s in doc.shards for r in s.replicas)
