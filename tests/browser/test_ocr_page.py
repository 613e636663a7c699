"""The page reading a page of text through the OCR chain (docs/models.md, "Chains"), in headless Chromium:
each line the chain answers is boxed on the image, and listed with its text, in order."""

from __future__ import annotations

import pytest

from funnel.scripts.prepare_model import prepare
from funnel.scripts.stack import Stack
from tests.browser.test_page import CHROMIUM, browser, page, pick, wait_for  # noqa: F401  (fixtures)
from tests.integration.test_ocr_chain import OCR_MODELS, drawn_page

pytestmark = pytest.mark.timeout(240)
assert CHROMIUM


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    store = tmp_path_factory.mktemp("ocr-page-store")
    for name in OCR_MODELS:
        prepare(store, name)
    with Stack(model_store=store, log_dir=tmp_path_factory.mktemp("ocr-page-stack")) as running:
        yield running


def test_a_page_read_shows_each_lines_box_and_text(page, tmp_path):  # noqa: F811  (the fixture above)
    from rapidocr_onnxruntime import RapidOCR

    image = drawn_page(6, 5)
    expected = [text for _, text, _ in RapidOCR()(image)[0]]
    (tmp_path / "page.png").write_bytes(image)
    panel = pick(page, "ocr")
    panel.locator("input[type=file]").set_input_files(str(tmp_path / "page.png"))
    wait_for(panel, "done")
    assert panel.locator(".lines .text").all_inner_texts() == expected
    boxes = panel.locator(".boxes polygon.read")
    assert boxes.count() == len(expected)
    first = [tuple(map(float, point.split(","))) for point in boxes.first.get_attribute("points").split()]
    assert len(first) == 4 and all(x >= 0 and y >= 0 for x, y in first)
    page.screenshot(path=tmp_path / "ocr-laptop.png", full_page=True)
