"""A real headless Chromium for the console tests: Debian's ``chromium`` driven by its
``chromedriver`` through Selenium (``make chromium`` installs both; no browser is downloaded:
the driver and the browser are given by path, so Selenium Manager is never asked).

Each browser gets a fresh profile and starts with nothing that talks to the network on its own
(no sync, no component updates, no QUIC). Screenshots go to ``KDELAY_CONSOLE_SCREENSHOTS`` (a
folder; ``make console-screenshots`` sets it to docs/console) or else to the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)


def screenshots_dir(tmp_path: Path) -> Path:
    """Where screenshots go (module docstring)."""
    chosen = os.environ.get("KDELAY_CONSOLE_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile in ``profile``; quit on exit."""
    for tool in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: `make chromium` installs Debian's chromium (as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # for statuses()
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager fetch anything
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(
    driver: WebDriver, what: str, check: Callable[[WebDriver], object], timeout: float = 60.0
) -> object:
    """Wait until ``check`` gives something true; fail naming ``what`` and the page's notice."""
    try:
        # The page re-renders as answers come: an element read mid-way is asked again.
        waiting = WebDriverWait(
            driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
        )
        return waiting.until(check)
    except WebDriverException:
        notice = text(driver, "#notice")
        pytest.fail(f"the console did not show {what} within {timeout} s (notice: {notice!r})")


def find(driver: WebDriver, css: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, css)


def find_all(driver: WebDriver, css: str) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, css)


def text(driver: WebDriver, css: str) -> str:
    """The text of the first element ``css`` selects ("" when none does)."""
    found = find_all(driver, css)
    return str(found[0].get_attribute("textContent") or "") if found else ""


def attributes(driver: WebDriver, css: str, name: str) -> list[str]:
    """Attribute ``name`` of every element ``css`` selects, read at once (one script)."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " (e) => e.getAttribute(arguments[1]) || '');",
        css,
        name,
    )
    return [str(v) for v in found]


def statuses(driver: WebDriver) -> dict[str, int]:
    """The HTTP status of each URL the browser got an answer for since the last call (the
    performance log's Network.responseReceived events)."""
    seen: dict[str, int] = {}
    log: list[dict[str, str]] = driver.get_log("performance")  # type: ignore[no-untyped-call]
    for entry in log:
        event = json.loads(entry["message"])["message"]
        if event.get("method") == "Network.responseReceived":
            response = event["params"]["response"]
            seen[str(response["url"])] = int(response["status"])
    return seen


def fill(driver: WebDriver, css: str, value: str) -> None:
    field = find(driver, css)
    field.clear()
    field.send_keys(value)
