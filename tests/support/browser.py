"""Headless Chromium driven by selenium for the status page's tests (docs/status-page.md).

    with chromium(tmp_path) as driver:
        driver.get(f"http://127.0.0.1:{port}/")
        shown(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#models tr"), "a model row")

Debian's ``chromium`` and ``chromium-driver`` (scripts/test.sh installs them): ``--headless=new``,
``--no-sandbox`` (the tests may run as root) and a profile directory of its own under the test's
tmp dir. ``shown`` is WebDriverWait with a condition: the browser tests never sleep.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")

CHROMIUM = "chromium"
CHROMEDRIVER = "chromedriver"


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/lib/chromium")
    if found is None:
        raise RuntimeError(f"{name} is not installed: scripts/test.sh installs Debian's chromium "
                           "and chromium-driver")
    return found


@contextlib.contextmanager
def chromium(tmp_path: Path, width: int = 1400, height: int = 1000) -> Iterator[webdriver.Chrome]:
    """A headless Chromium with its own profile under ``tmp_path``; quit on leaving."""
    options = webdriver.ChromeOptions()
    options.binary_location = _binary(CHROMIUM)
    profile = Path(tmp_path) / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}",
                 "--no-first-run", "--no-default-browser-check"):
        options.add_argument(flag)
    service = Service(executable_path=_binary(CHROMEDRIVER), log_output=str(profile / "driver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def shown(driver: webdriver.Chrome, condition: Callable[[webdriver.Chrome], T], what: str,
          timeout: float = 30.0) -> T:
    """Wait until ``condition(driver)`` is truthy and return it; TimeoutException naming ``what``."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, message=f"timed out after {timeout} s waiting for {what}")
