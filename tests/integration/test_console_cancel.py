"""The console's cancels in a real headless Chromium against a real proxy and two replicas
(tests/support/console_stack.py): a message's cancel, confirmed in a dialog, answers once the
master decided (``DELETE /v1/messages/{id}?wait=5``: "Cancelled") and the message is cancelled;
a bulk cancel of the pending page's filter (an id prefix and a topic) asks the operator to type
the prefix, then says how many it cancelled (``DELETE /v1/messages?id_prefix=..&topic=..&wait=5``),
and exactly those are cancelled: another prefix's and another topic's stay pending. Screenshots
of the confirmations (docs/console/ with ``make console-screenshots``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.support.browser import chromium, fill, find, screenshots_dir, text, wait_for
from tests.support.console_stack import MIN, ConsoleStack, console_stack, now_ms
from tests.support.infra import KafkaInfra, ZooKeeperInfra

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(
    kafka: KafkaInfra, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleStack]:
    base = tmp_path_factory.mktemp("console-cancel")
    with console_stack(base, kafka.bootstrap_servers, zookeeper.connect) as s:
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshots_dir(tmp_path_factory.mktemp("shots"))


def dialog_open(d: WebDriver) -> bool:
    return bool(d.execute_script("return document.querySelector('#confirm').open"))


def test_a_message_is_cancelled_after_a_confirmation(
    stack: ConsoleStack, browser: WebDriver, shots: Path
) -> None:
    msg_id = f"cancel-{uuid.uuid4().hex[:8]}"
    stack.post(msg_id, now_ms() + 30 * MIN)
    stack.wait_state(msg_id, "pending")
    browser.get(f"{stack.ui}#/message/{msg_id}")
    wait_for(browser, "its state", lambda d: text(d, "td[data-field=state]") == "pending")

    # Declined: nothing happens.
    find(browser, "#m-cancel").click()
    wait_for(browser, "the confirmation", dialog_open)
    assert text(browser, "#confirm-text").startswith(f"Cancel message {msg_id}, due ")
    find(browser, "#confirm-no").click()
    wait_for(browser, "the dialog closed", lambda d: not dialog_open(d))
    assert text(browser, "#m-result") == ""
    assert stack.status(msg_id)["state"] == "pending"

    find(browser, "#m-cancel").click()
    wait_for(browser, "the confirmation", dialog_open)
    shots_path = shots / "cancel-confirm.png"
    assert browser.save_screenshot(str(shots_path))
    find(browser, "#confirm-ok").click()
    wait_for(
        browser,
        "the confirmed cancel",
        lambda d: text(d, "#m-result") == f"Cancelled: {msg_id} will never be delivered.",
    )
    wait_for(browser, "the new state", lambda d: text(d, "td[data-field=state]") == "cancelled")
    assert stack.status(msg_id)["state"] == "cancelled"
    assert not find(browser, "#m-cancel").is_enabled()


def test_bulk_cancel_of_the_filtered_set_after_typing_the_prefix(
    stack: ConsoleStack, browser: WebDriver, shots: Path
) -> None:
    other_topic = stack.new_topic("console-bulk-other")
    prefix = f"customer-{uuid.uuid4().hex[:6]}-"
    due = now_ms() + 20 * MIN
    doomed = [f"{prefix}{i}" for i in range(4)]
    for msg_id in doomed:
        stack.post(msg_id, due)
    spared = [f"{prefix}elsewhere", f"keep-{uuid.uuid4().hex[:6]}"]
    stack.post(spared[0], due, other_topic)  # the prefix, another topic
    stack.post(spared[1], due)  # the topic, another prefix
    for msg_id in [*doomed, *spared]:
        stack.wait_state(msg_id, "pending")

    browser.get(f"{stack.ui}#/pending")
    wait_for(browser, "the pending page", lambda d: find(d, "#pending").is_displayed())
    Select(find(browser, "#f-window")).select_by_value("1h")
    fill(browser, "#f-topic", stack.topic)
    fill(browser, "#f-prefix", prefix)
    find(browser, "#f-apply").click()
    wait_for(
        browser,
        "the prefix's messages",
        lambda d: len(d.find_elements("css selector", "#pending-table tbody tr")) == len(doomed),
    )
    find(browser, "#bulk-cancel").click()
    wait_for(browser, "the confirmation", dialog_open)
    assert f'whose id starts with "{prefix}"' in text(browser, "#confirm-text")
    assert f"whose target topic is {stack.topic}" in text(browser, "#confirm-text")
    assert not find(browser, "#confirm-ok").is_enabled()  # until the prefix is typed
    fill(browser, "#confirm-input", prefix[:-1])
    assert not find(browser, "#confirm-ok").is_enabled()
    find(browser, "#confirm-input").send_keys(prefix[-1])
    wait_for(browser, "the confirm button", lambda d: find(d, "#confirm-ok").is_enabled())
    assert browser.save_screenshot(str(shots / "bulk-cancel-confirm.png"))
    find(browser, "#confirm-ok").click()
    wait_for(
        browser,
        "the count cancelled",
        lambda d: text(d, "#bulk-result") == f"Cancelled {len(doomed)} pending message(s).",
    )
    wait_for(browser, "an empty list", lambda d: find(d, "#pending-empty").is_displayed())
    assert browser.save_screenshot(str(shots / "bulk-cancel-done.png"))
    for msg_id in doomed:
        stack.wait_state(msg_id, "cancelled")
    for msg_id in spared:
        assert stack.status(msg_id)["state"] == "pending", msg_id
