"""The page's file picker, for a model of input kind `file`, in a real headless Chromium: the outside
audio model (tests/third_party/toyaudio), two WAVs chosen at once, answered as two items."""

from __future__ import annotations

import json

import pytest
from playwright import sync_api

from funnel.scripts.stack import Stack
from tests import outside_models, toy_model
from tests.browser.test_page import CHROMIUM, FLAGS, LAPTOP, WAIT_MS, pick, wait_for  # skips without Chromium
from tests.integration.test_outside_detector_and_audio import LEVELS, WAVS

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    store, work = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("graphs")
    outside_models.add_levels(store, work, LEVELS)
    env = {"PYTHONPATH": toy_model.outside_env()["PYTHONPATH"]}
    with Stack(model_store=store, web_env=env, worker_env=env) as running:
        yield running


def test_two_wavs_chosen_in_the_picker_are_two_items(stack, tmp_path):
    paths = []
    for i, data in enumerate(WAVS[:2]):
        paths.append(tmp_path / f"clip-{i}.wav")
        paths[-1].write_bytes(data)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(stack.url + "/")
            panel = pick(page, LEVELS)
            picker = panel.locator("input[type=file]")
            assert picker.get_attribute("accept") == "audio/wav,audio/x-wav,audio/wave,audio/vnd.wave"
            picker.set_input_files(paths)
            panel.locator("button[type=submit]").click()
            wait_for(panel, "done")
            answer = json.loads(panel.locator("pre.json").inner_text())
            assert [r["sample_rate"] for r in answer["results"]] == [8_000, 11_025]
            assert not errors, errors
        finally:
            browser.close()
