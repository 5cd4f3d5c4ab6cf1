"""The status page in headless Chromium over 10,000 resident models (a fake cache behind a real
ObserveServer): only one page of rows is in the DOM, the search box finds a model, paging works,
and the refresh keeps the page and the search as they were."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from support.browser import chromium, shown
from support.fakecache import FakeCache, resident
from tfscache.frontend.backends import NodeBackend
from tfscache.observe.metrics import Metrics
from tfscache.observe.server import ObserveServer

from .test_status_document import FakeUpstream, topology

MODELS = 10_000
PAGE_SIZE = 50  # page.js's PAGE_SIZE


class ServerThread:
    """An ObserveServer on an event loop of its own thread, for a blocking browser test."""

    def __init__(self, server: ObserveServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


@pytest.fixture(scope="module")
def page_url() -> Iterator[str]:
    many = FakeCache([resident(f"model-{i:05d}", size=1000 + i, last_use=1.0)
                      for i in range(MODELS)], max_models=MODELS, memory_bytes=0)
    few = FakeCache([resident("other", leases=1)], max_models=4)
    nodes = [NodeBackend("node0", FakeUpstream("127.0.0.1:1"), many),
             NodeBackend("node1", FakeUpstream("127.0.0.1:2"), few)]
    metrics = Metrics(process=False)
    for i in range(600):  # more than the timeline keeps
        metrics.cache_events("node0").evicted((f"model-{i:05d}", 1), "capacity", 1000)
    server = ObserveServer(metrics, topology(nodes), bind_address="127.0.0.1", port=0)
    with ServerThread(server) as port:
        yield f"http://127.0.0.1:{port}/"


def rows(driver, table: str, attribute: str = "model") -> list[str]:
    """``data-ATTRIBUTE`` of each row of ``table``, read in one script (a refresh swaps the
    tbody, so elements found a moment earlier may be gone)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), r => r.dataset[arguments[1]])",
        f"#{table} tr", attribute)


def model_names(driver) -> list[str]:
    return rows(driver, "models")


def first_row_text(driver) -> str:
    return driver.execute_script("return document.querySelector('#models tr').innerText")


def page_info(driver) -> str:
    return driver.find_element(By.ID, "page-info").text


def test_ten_thousand_models_are_paged_searched_and_stay_so_across_refreshes(page_url, tmp_path):
    with chromium(tmp_path) as driver:
        driver.get(page_url)
        shown(driver, lambda d: f"of {MODELS + 1})" in page_info(d), "the first page")
        names = model_names(driver)
        assert len(names) == PAGE_SIZE and names[0] == "model-00000"
        assert "page 1 of 201" in page_info(driver)
        timeline = rows(driver, "timeline")
        assert len(timeline) == 500 and timeline[0] == "model-00599"  # the bound, newest first

        driver.find_element(By.ID, "next").click()
        shown(driver, lambda d: model_names(d)[:1] == ["model-00050"], "page 2")
        assert "page 2 of 201 (51-100 of 10001)" in page_info(driver)
        driver.find_element(By.ID, "prev").click()
        shown(driver, lambda d: model_names(d)[:1] == ["model-00000"], "page 1 again")

        driver.find_element(By.ID, "search").send_keys("model-07342")
        shown(driver, lambda d: model_names(d) == ["model-07342"], "the search's one model")
        updated = driver.find_element(By.ID, "updated").text
        shown(driver, lambda d: d.find_element(By.ID, "updated").text != updated, "a refresh")
        assert model_names(driver) == ["model-07342"]  # the refresh keeps the search
        assert "node0" in first_row_text(driver) and "available" in first_row_text(driver)

        search = driver.find_element(By.ID, "search")
        search.clear()
        search.send_keys("other")
        shown(driver, lambda d: model_names(d) == ["other"], "node1's model")
        driver.save_screenshot(str(tmp_path / "status-page-many.png"))
        assert (tmp_path / "status-page-many.png").stat().st_size > 0
