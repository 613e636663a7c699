"""The page at GET / in a real headless Chromium, against the whole stack (Redis, web, workers).

Playwright drives the system Chromium (`apt-get install chromium`); without it the module skips.
Every wait is on a DOM condition with a timeout; screenshots go to each test's tmp_path.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from playwright import sync_api
from playwright.sync_api import expect

from funnel.scripts.stack import Stack

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("Chromium is not installed: apt-get install chromium (requirements/apt-browser.txt)",
                allow_module_level=True)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 30_000  # the longest any one DOM condition is waited for
LAPTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]

pytestmark = pytest.mark.timeout(180)  # the first test also waits for the stack (at most 120 s)


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, log_dir=tmp_path_factory.mktemp("browser-stack")) as running:
        yield running


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium with a fresh profile for the module."""
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=FLAGS, viewport=LAPTOP, timeout=WAIT_MS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture()
def page(browser, stack):
    """A fresh tab on the page; fails the test on a JavaScript error or a request off the stack."""
    tab = browser.new_page()
    tab.set_default_timeout(WAIT_MS)
    errors, foreign = [], []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("request", lambda req: None if req.url.startswith((stack.url, "blob:", "data:"))
           else foreign.append(req.url))
    tab.goto(stack.url + "/")
    yield tab
    tab.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
    assert not foreign, f"the page fetched something that is not the stack's: {foreign}"


def pick(page, model: str):
    """Choose a model in the picker, as a person does, and return its panel."""
    page.locator(".picker label", has_text=model).click()
    panel = page.locator(f'section.panel[data-model="{model}"]')
    expect(panel).to_be_visible()
    return panel


def wait_for(panel, state: str):
    expect(panel).to_have_attribute("data-state", re.compile(f"^(?:{state}|error|done)$"), timeout=WAIT_MS)
    if panel.get_attribute("data-state") != state:
        pytest.fail(f"expected {state}, the panel shows: {panel.locator('.result').inner_text()}")


def check_timings(panel):
    timings = dict(zip(panel.locator(".timings dt").all_inner_texts(),
                       panel.locator(".timings dd").all_inner_texts()))
    assert {"round trip", "queue", "inference", "batch size"} <= set(timings), timings
    for name in ("round trip", "queue", "inference"):
        assert re.fullmatch(r"[\d.]+ ms(?:–[\d.]+ ms)?", timings[name]), timings
    assert timings.get("worker") or timings.get("workers"), timings


def no_horizontal_scroll(page):
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"the page is wider than the window: {width}"


def classify_cat(page, panel, cat_jpeg, tmp_path):
    photo = tmp_path / "chelsea.jpg"
    photo.write_bytes(cat_jpeg)
    panel.locator("input[type=file]").set_input_files(photo)
    wait_for(panel, "done")
    return panel.locator(".top5 .label").all_inner_texts()


def test_cat_photo_shows_cat_first_with_timings(page, cat_jpeg, tmp_path):
    panel = pick(page, "image-classifier")
    labels = classify_cat(page, panel, cat_jpeg, tmp_path)
    assert len(labels) == 5 and "cat" in labels[0].lower(), labels
    expect(panel.locator(".preview")).to_be_visible()
    percents = [float(p.rstrip("%")) for p in panel.locator(".top5 .pct").all_inner_texts()]
    assert percents == sorted(percents, reverse=True) and 0 < percents[0] <= 100, percents
    check_timings(panel)
    no_horizontal_scroll(page)
    page.screenshot(path=tmp_path / "image-laptop.png", full_page=True)


def test_the_footer_leads_to_the_dashboard_and_back(page, stack):
    page.locator("footer a", has_text="dashboard").click()
    page.wait_for_url(stack.url + "/dashboard")
    expect(page.locator("h1")).to_contain_text("dashboard")
    page.locator("footer a", has_text="the page").click()
    page.wait_for_url(stack.url + "/")
    expect(page.locator(".picker")).to_be_visible()


def test_sentence_similarity_table(page, tmp_path):
    panel = pick(page, "text-embedding")
    panel.locator(".text-form textarea").fill("\n".join(SENTENCES))
    panel.get_by_role("button", name="Compare").click()
    wait_for(panel, "done")

    def cosine(i, j):
        cell = panel.locator(f'td[data-i="{i}"][data-j="{j}"]')
        return float(cell.get_attribute("data-value")), float(cell.inner_text())

    (food_bread, shown), (food_baby, _) = cosine(0, 1), cosine(0, 2)
    assert food_bread > food_baby, (food_bread, food_baby)
    assert food_bread == pytest.approx(0.755, abs=0.01) and shown == pytest.approx(food_bread, abs=0.005)
    assert cosine(1, 0)[0] == pytest.approx(food_bread, abs=1e-4) and cosine(0, 0)[0] == pytest.approx(1, abs=1e-3)
    assert panel.locator(".sentences li").all_inner_texts() == SENTENCES
    check_timings(panel)
    page.screenshot(path=tmp_path / "text-laptop.png", full_page=True)


def test_text_file_named_jpg_gives_a_readable_error(page, tmp_path):
    fake = tmp_path / "notes.jpg"
    fake.write_text("these are notes, not a picture\n")
    panel = pick(page, "image-classifier")
    panel.locator("input[type=file]").set_input_files(fake)
    wait_for(panel, "error")
    message = panel.locator(".error").inner_text()
    assert "not an image" in message.lower(), message
    assert "{" not in message and '"error"' not in message, message  # not raw JSON
    expect(panel.locator(".preview")).to_be_hidden()  # named, not drawn as a broken image
    expect(panel.locator(".drop .file")).to_contain_text("notes.jpg")
    page.screenshot(path=tmp_path / "error-laptop.png", full_page=True)


def error_reply(status, code, message, **headers):
    return {"status": status, "headers": headers, "content_type": "application/json",
            "body": json.dumps({"error": {"code": code, "message": message}})}


@pytest.mark.parametrize("reply, title, detail", [
    (error_reply(413, "request_entity_too_large", "The data value transmitted exceeds the capacity limit."),
     "File too large", "capacity limit"),
    (error_reply(503, "overloaded", "the text-embedding queue is full; retry shortly", **{"Retry-After": "1"}),
     "Server busy, try again", "queue is full"),
    (error_reply(504, "timeout", "no reply before the deadline"), "Timed out", "deadline"),
    (error_reply(401, "unauthorized", "send a valid API key as 'Authorization: Bearer <key>'"),
     "API key", "Bearer"),
    ({"status": 502, "content_type": "text/html", "body": "<html><h1>Bad Gateway</h1></html>"},
     "Server unreachable", "HTTP 502"),
    (None, "Could not reach the server", ""),
], ids=["413", "503", "504", "401", "502-html", "network-down"])
def test_error_statuses_read_as_sentences(page, reply, title, detail):
    """Statuses the stack gives only under load or misconfiguration, answered here by the browser's router."""
    page.route("**/v1/models/*/predict",
               lambda route: route.fulfill(**reply) if reply else route.abort("connectionrefused"))
    panel = pick(page, "text-embedding")
    panel.locator(".text-form textarea").fill("A man is eating food.")
    panel.get_by_role("button", name="Compare").click()
    wait_for(panel, "error")
    message = panel.locator(".error").inner_text()
    assert title in message and detail in message and "{" not in message, message
    expect(panel.get_by_role("button", name="Compare")).to_be_enabled()


def test_phone_width_layout_and_drag_and_drop(page, cat_jpeg, tmp_path):
    page.set_viewport_size(PHONE)
    panel = pick(page, "image-classifier")
    # Drop the photo on the drop zone: a DataTransfer holding a File, as a real drag brings.
    transfer = page.evaluate_handle("""bytes => {
        const transfer = new DataTransfer();
        transfer.items.add(new File([new Uint8Array(bytes)], "chelsea.jpg", {type: "image/jpeg"}));
        return transfer;
    }""", list(cat_jpeg))
    panel.locator(".drop").dispatch_event("drop", {"dataTransfer": transfer})
    wait_for(panel, "done")
    assert "cat" in panel.locator(".top5 .label").first.inner_text().lower()
    drop, result = panel.locator(".drop").bounding_box(), panel.locator(".result").bounding_box()
    assert result["y"] >= drop["y"] + drop["height"], "at phone width the result goes under the image"
    no_horizontal_scroll(page)
    page.screenshot(path=tmp_path / "image-phone.png", full_page=True)

    panel = pick(page, "text-embedding")
    panel.locator(".text-form textarea").fill("\n".join(SENTENCES))
    panel.locator(".text-form textarea").press("Control+Enter")
    wait_for(panel, "done")
    expect(panel.locator(".matrix td")).to_have_count(9)
    no_horizontal_scroll(page)
    page.screenshot(path=tmp_path / "text-phone.png", full_page=True)


def test_bulk_job_progress_download_and_cancel(page, tmp_path):
    """A text model's bulk box: lines become one job, its progress shows until done, the results
    download as JSON Lines in input order; a longer job from a .txt file is cancelled mid-way."""
    panel = pick(page, "text-embedding")
    box = panel.locator(".bulk")
    box.locator("summary").click()
    lines = [f"bulk line {i}: {SENTENCES[i % 3]}" for i in range(40)]
    box.locator("textarea").fill("\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:]))  # a blank line skipped
    box.get_by_role("button", name="Start job").click()
    expect(box).to_have_attribute("data-job-state", re.compile("^(done|failed|cancelled|error)$"), timeout=WAIT_MS)
    assert box.get_attribute("data-job-state") == "done", box.locator(".bulk-status").inner_text()
    expect(box.locator(".bulk-line")).to_have_text("done · 40 / 40")
    # the results shown as they came (the job's events), each beside its line, in input order
    expect(box.locator(".bulk-results li")).to_have_count(40)
    assert box.locator(".bulk-results .text").all_inner_texts() == [line for line in lines if line.strip()]
    assert all(answer.startswith("384-d [") for answer in box.locator(".bulk-results .answer").all_inner_texts())
    assert float(box.locator("progress").get_attribute("value")) == 1
    expect(box.get_by_role("button", name="Cancel")).to_be_hidden()
    with page.expect_download() as download:
        box.get_by_role("link", name="Download results (JSON Lines)").click()
    results = [json.loads(line) for line in open(download.value.path()).read().splitlines()]
    assert len(results) == 40 and all(len(r["embedding"]) == 384 for r in results)
    # In input order, the blank line skipped: result 17 is the embedding of lines[17].
    first = page.evaluate("""text => fetch('/v1/models/text-embedding/predict', {method: 'POST',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify({text})}).then(r => r.json())""",
                          lines[17])
    assert results[17]["embedding"] == pytest.approx(first["embedding"], abs=1e-4)

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"cancelled passage {i}: {'the quick brown fox ' * (i % 9)}\n" for i in range(4000)))
    box.locator("input[type=file]").set_input_files(corpus)
    box.get_by_role("button", name="Start job").click()
    expect(box).to_have_attribute("data-job-state", re.compile("^(queued|running)$"), timeout=WAIT_MS)
    box.get_by_role("button", name="Cancel").click()
    expect(box).to_have_attribute("data-job-state", "cancelled", timeout=WAIT_MS)
    counts = re.search(r"([\d,]+) / ([\d,]+)", box.locator(".bulk-line").inner_text()).groups()
    done, total = (int(n.replace(",", "")) for n in counts)
    assert total == 4000 and done < total
    expect(box.get_by_role("link", name="Download results (JSON Lines)")).to_be_visible()
    page.screenshot(path=tmp_path / "bulk-laptop.png", full_page=True)
