"""The dashboard at GET /dashboard in a real headless Chromium, against a real stack: a worker appears,
a queue grows under load and drains, a job shows its progress, a killed worker disappears.

Every wait is on a DOM condition with a timeout. Screenshots go to the test's tmp_path, and to
FUNNEL_SCREENSHOTS when it names a folder (how docs/operations.md's were taken).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from funnel.scripts.stack import Stack
from tests.browser.test_page import CHROMIUM, FLAGS, LAPTOP, WAIT_MS, expect, sync_api
from tests.support import cached_store, http

MODEL = "text-embedding"
TEXTS = 2000  # a bulk job the worker takes seconds to drain: several readings see it
KEYS = "alice=key-alice,bob=key-bob,ops=key-ops"

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    # No worker at first; one silent for 3 s is dead, so a killed one leaves the registry quickly.
    with Stack(model_store=model_store, models=[MODEL], workers=[],
               web_env={"FUNNEL_API_KEYS": KEYS, "FUNNEL_ADMIN_KEYS": "ops"},
               worker_env={"FUNNEL_HEARTBEAT_TTL_S": "3"},
               log_dir=tmp_path_factory.mktemp("dashboard-stack")) as running:
        yield running


@contextlib.contextmanager
def dashboard(url: str, tmp_path: Path) -> Iterator:
    """The dashboard open in headless Chromium; no JavaScript error on it, checked on the way out."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=FLAGS, viewport=LAPTOP,
            timeout=WAIT_MS)
        tab = browser.new_page()
        tab.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(url + "/dashboard")
        yield tab
        browser.close()
    assert not errors, f"JavaScript errors on the dashboard: {errors}"


@pytest.fixture()
def page(stack, tmp_path):
    with dashboard(stack.url, tmp_path) as tab:
        yield tab


def shoot(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=tmp_path / name, full_page=True)
    if os.environ.get("FUNNEL_SCREENSHOTS"):
        page.screenshot(path=Path(os.environ["FUNNEL_SCREENSHOTS"]) / name, full_page=True)


def value(panel, metric: str) -> str:
    return panel.locator(f'[data-metric="{metric}"]').inner_text()


def test_the_state_needs_a_key_and_the_page_asks_for_it(stack):
    status, body, _ = http("GET", f"{stack.url}/dashboard/state")
    assert status == 401, body
    status, body, _ = http("GET", f"{stack.url}/dashboard")
    assert status == 200  # the page itself holds no data


def test_worker_appears_queue_grows_and_drains_killed_worker_disappears(page, stack, tmp_path):
    page.locator("#key input").fill("key-ops")
    page.locator("#key button").click()
    panel = page.locator(f'section.panel[data-model="{MODEL}"]')
    expect(panel.locator("[data-no-workers]")).to_be_visible()

    expect(panel.locator('tr[data-version="1"]')).to_contain_text("off")  # no cache: no hit rate, no chart
    expect(panel.locator('[data-metric="cache"]')).to_have_count(0)

    worker = stack.start_worker(MODEL)
    rows = panel.locator("tr[data-worker]")
    expect(rows).to_have_count(1)
    shoot(page, tmp_path, "dashboard-worker.png")

    alice = {"Authorization": "Bearer key-alice"}
    status, job, _ = http("POST", f"{stack.url}/v1/models/{MODEL}/jobs", headers=alice,
                          json_body={"texts": [f"sentence number {i} of the load" for i in range(TEXTS)]})
    assert status == 202, job
    stop = threading.Event()

    def predicts():  # interactive answers beside the job, for the rates and latencies
        while not stop.is_set():
            http("POST", f"{stack.url}/v1/models/{MODEL}/predict", headers=alice, json_body={"text": "hello"})

    load = threading.Thread(target=predicts, daemon=True)
    load.start()
    try:
        expect(panel.locator('[data-metric="queue"]')).not_to_have_text("0")
        job_row = page.locator(f'tr[data-job="{job["id"]}"]')
        expect(job_row).to_be_visible()
        assert "alice" in job_row.inner_text()
        shoot(page, tmp_path, "dashboard-load.png")
        expect(panel.locator('[data-metric="rps"]')).not_to_have_text("–")
        expect(panel.locator('[data-metric="queue"]')).to_have_text("0", timeout=120_000)
        expect(job_row).to_have_count(0)  # finished: no longer listed
    finally:
        stop.set()
        load.join(timeout=30)
    assert float(value(panel, "rps")) > 0
    latency = value(panel, "latency")
    assert latency.count("ms") == 2, latency
    shoot(page, tmp_path, "dashboard-drained.png")

    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    expect(rows).to_have_count(0)
    expect(panel.locator("[data-no-workers]")).to_be_visible()
    shoot(page, tmp_path, "dashboard-worker-gone.png")


def test_a_key_sees_its_own_jobs_only(stack):
    status, job, _ = http("POST", f"{stack.url}/v1/models/{MODEL}/jobs", headers={"Authorization": "Bearer key-alice"},
                          json_body={"texts": ["waits: no worker serves it now"]})
    assert status == 202, job
    mine = {"Authorization": "Bearer key-alice"}
    status, state, _ = http("GET", f"{stack.url}/dashboard/state", headers=mine)
    assert status == 200 and job["id"] in {j["id"] for j in state["jobs"]}
    status, state, _ = http("GET", f"{stack.url}/dashboard/state", headers={"Authorization": "Bearer key-ops"})
    assert job["id"] in {j["id"] for j in state["jobs"]}  # an admin sees every job
    status, state, _ = http("GET", f"{stack.url}/dashboard/state", headers={"Authorization": "Bearer key-bob"})
    assert status == 200 and state["jobs"] == []  # another key: not alice's


def test_a_cached_models_hit_rate_per_version(model_store, tmp_path):
    """A model caching results, two versions: each version's hit rate and its hits, misses and
    coalesced items since the web processes started, and the model's hit rate over the last
    readings as a chart."""
    store = cached_store(model_store, tmp_path, MODEL, versions=(1, 2))
    with Stack(model_store=store, models=[MODEL], workers=[f"{MODEL}:1", f"{MODEL}:2"],
               log_dir=tmp_path / "logs") as cached, dashboard(cached.url, tmp_path) as page:
        panel = page.locator(f'section.panel[data-model="{MODEL}"]')
        first, second = (panel.locator(f'tr[data-version="{v}"] [data-cache]') for v in (1, 2))
        expect(first.locator('[data-metric="hit-rate"]')).to_have_text("–")
        expect(panel.locator('[data-metric="cache"]')).to_have_text("–")

        def predict(version: int, body: dict) -> None:
            path = f"{cached.url}/v1/models/{MODEL}/versions/{version}/predict"
            assert http("POST", path, json_body=body)[0] == 200

        predict(1, {"text": "seen twice"})  # miss
        predict(1, {"text": "seen twice"})  # hit
        predict(1, {"texts": ["one request, twice", "one request, twice"]})  # miss, coalesced
        predict(2, {"text": "seen twice"})  # miss: another version's entries are not its own
        expect(first.locator('[data-metric="hit-rate"]')).to_have_text("25.0%")
        expect(first).to_contain_text("(1 · 2 · 1)")
        expect(second.locator('[data-metric="hit-rate"]')).to_have_text("0.0%")
        expect(second).to_contain_text("(0 · 1 · 0)")
        expect(panel.locator('[data-metric="cache"]')).to_have_text("20.0")  # 1 hit of 5 items, both versions
        shoot(page, tmp_path, "dashboard-cache.png")
