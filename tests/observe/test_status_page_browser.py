"""The status page of a real ``tfscache serve`` in headless Chromium (docs/status-page.md).

One serve (one embedded ``tfscache node``, at most 2 models resident, an admin token) over
addk_1..addk_3. The browser opens ``/`` of the metrics port, is asked for the token and gives it
in the page's field; a request makes addk_1 appear on node0; requests for addk_2 and addk_3 churn
it out, and the timeline shows its eviction. The screenshot is kept under the test's tmp dir
(docs/images/status-page.png is one of them).
"""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from support import fixtures
from support.browser import chromium, shown
from support.requests import predict_request
from support.serving import link_repository, start_serve

from .test_status_page_many import rows

CAP = 2
TOKEN = "s3cret"


@pytest.fixture(scope="module")
def serve(synthetic_models, tmp_path_factory):
    repo = link_repository(tmp_path_factory.mktemp("page") / "models", synthetic_models([1, 2, 3]))
    with start_serve(tmp_path_factory.mktemp("serve"), repo, "--local-nodes", "1",
                     "--max-models-per-node", str(CAP), "--metrics-port", "0",
                     "--set", f"server.admin_token={TOKEN}") as process:
        yield process


stub = fixtures.stub_on("serve")


def predict(stub, name: str) -> float:
    return stub.Predict(predict_request(name, 1.0), timeout=120).outputs["y"].float_val[0]


def resident_on(driver, node: str) -> list[tuple[str, str]]:
    """(model, state) of each row of the models table on ``node``."""
    return [tuple(r) for r in driver.execute_script(
        "return Array.from(document.querySelectorAll('#models tr'))"
        ".filter(r => r.dataset.node === arguments[0])"
        ".map(r => [r.dataset.model, r.cells[3].innerText])", node)]


def timeline(driver) -> list[tuple[str, str]]:
    """(kind, model) of each timeline row, newest first."""
    return list(zip(rows(driver, "timeline", "kind"), rows(driver, "timeline")))


def test_a_request_shows_its_model_and_churn_shows_an_eviction(serve, stub, tmp_path):
    with chromium(tmp_path) as driver:
        driver.get(f"http://127.0.0.1:{serve.metrics_port}/")
        form = shown(driver, lambda d: d.find_element(By.ID, "token-form").is_displayed()
                     and d.find_element(By.ID, "token-form"), "the page to ask for the token")
        form.find_element(By.ID, "token").send_keys(TOKEN)
        form.find_element(By.CSS_SELECTOR, "button").click()
        shown(driver, lambda d: rows(d, "nodes", "node") == ["node0"], "node0's row")
        assert not driver.find_element(By.ID, "token-form").is_displayed()

        assert predict(stub, "addk_1") == 2.0
        shown(driver, lambda d: resident_on(d, "node0") == [("addk_1", "available")],
              "addk_1 available on node0")
        shown(driver, lambda d: ("loaded", "addk_1") in timeline(d), "addk_1's load")

        assert predict(stub, "addk_2") == 3.0
        assert predict(stub, "addk_3") == 4.0  # over the cap of 2: the LRU one, addk_1, goes
        shown(driver, lambda d: ("evicted", "addk_1") in timeline(d), "addk_1's eviction")
        shown(driver, lambda d: sorted(resident_on(d, "node0")) ==
              [("addk_2", "available"), ("addk_3", "available")], "addk_2 and addk_3 resident")
        evicted = driver.execute_script(
            "return document.querySelector('#timeline tr[data-kind=evicted]').innerText")
        assert "capacity" in evicted and "addk_1" in evicted
        cap_cell = driver.execute_script(
            "return document.querySelector('#nodes tr').cells[4].innerText")
        assert "2 / 2" in cap_cell
        assert "hits" in driver.find_element(By.ID, "hits").text
        screenshot = tmp_path / "status-page.png"
        driver.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
