"""OCR as a chain (common/tasks/ocr.py): text detection, then each line's direction, then each line read,
three served models in sequence, against RapidOCR() itself on the same images.

The pages: scikit-image's scanned `page()`, and pages drawn here of 5 to 40 lines, one of them turned
upside down (the direction model's case). Every line's text is the package's, its box within 2 pixels
and its confidence within 0.01; through /v1, /v2 and a bulk job.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import random
import signal

import numpy as np
import pytest
import redis

from funnel.common.link.connection import scan_keys
from funnel.common.store import list_models
from funnel.scripts.prepare_model import prepare
from funnel.scripts.stack import Stack
from tests.support import http, multipart, wait_for, worker_totals

OCR_MODELS = ("text-detector", "text-direction", "text-recognizer", "ocr")
# read()'s deadline of 120 s honoured (the web tier caps a request's at this): pages read at once take
# their sum on two cores, more on a loaded host, and a wait predicted past 30 s would be shed (503).
PATIENT = {"FUNNEL_REQUEST_TIMEOUT_S": "120"}
WORDS = ("queue", "batch", "worker", "Redis", "linger", "deadline", "reply", "funnel", "model", "version", "2026",
         "item", "request", "GPU", "tokens", "image", "score", "42", "latency", "throughput")


def png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def drawn_page(lines: int, seed: int, upside_down: bool = False) -> bytes:
    """A white page of `lines` lines of words in black, as a scanner would give it."""
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    font = ImageFont.load_default(size=22)
    page = Image.new("RGB", (900, 60 + 36 * lines), "white")
    draw = ImageDraw.Draw(page)
    for i in range(lines):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7)))
        draw.text((40 + rng.randint(0, 80), 30 + 36 * i), text, fill="black", font=font)
    return png(page.rotate(180) if upside_down else page)


@pytest.fixture(scope="module")
def pages() -> dict[str, bytes]:
    from PIL import Image
    from skimage import data

    return {"scanned": png(Image.fromarray(data.page())), "5 lines": drawn_page(5, 1), "20 lines": drawn_page(20, 2),
            "40 lines": drawn_page(40, 3), "upside down": drawn_page(8, 4, upside_down=True)}


@pytest.fixture(scope="module")
def reference():
    from rapidocr_onnxruntime import RapidOCR

    return RapidOCR()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    store = tmp_path_factory.mktemp("ocr-store")
    prepare(store, "ocr")  # the chain prepares its steps with it (funnel prepare --models ocr)
    assert list_models(store) == sorted(OCR_MODELS)
    with Stack(model_store=store, web_env=PATIENT) as running:
        yield running


def theirs(reference, image: bytes) -> list[dict]:
    found, _ = reference(image)
    return [{"box": box, "text": text, "confidence": float(score)} for box, text, score in found or []]


def read(stack, image: bytes) -> dict:
    body, headers = multipart("file", "page.png", image, "image/png")
    # a page of 40 lines takes seconds on two cores, and several at once their sum
    status, answer, _ = http("POST", f"{stack.url}/v1/models/ocr/predict", body,
                             {**headers, "X-Request-Timeout": "120"}, timeout=130)
    assert status == 200, answer
    return answer


def assert_same_lines(ours: list[dict], expected: list[dict]) -> None:
    assert [line["text"] for line in ours] == [line["text"] for line in expected]
    for mine, its in zip(ours, expected):
        assert np.abs(np.asarray(mine["box"]) - np.asarray(its["box"])).max() <= 2, (mine, its)
        assert abs(mine["confidence"] - its["confidence"]) <= 0.01, (mine, its)


@pytest.mark.parametrize("page", ["scanned", "5 lines", "20 lines", "40 lines", "upside down"])
def test_each_page_reads_as_rapidocr_reads_it(stack, pages, reference, page):
    expected = theirs(reference, pages[page])
    assert expected, f"RapidOCR reads nothing on {page}"
    assert_same_lines(read(stack, pages[page])["lines"], expected)


def test_pages_read_at_once_share_the_recognisers_batches(stack, pages, reference):
    import concurrent.futures

    images = [pages["20 lines"], pages["5 lines"], pages["scanned"], pages["upside down"]]
    with concurrent.futures.ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(lambda image: read(stack, image), images))
    for image, answer in zip(images, answers):
        assert_same_lines(answer["lines"], theirs(reference, image))


def test_a_pages_lines_ride_in_shared_batches(stack, pages):
    batches, items = worker_totals(stack, "text-recognizer")
    lines = len(read(stack, pages["20 lines"])["lines"])
    assert lines == 20
    wait_for(lambda: worker_totals(stack, "text-recognizer")[1] >= items + lines, timeout_s=30,
             what="the recogniser's workers to count the page's lines")
    batches_after, items_after = worker_totals(stack, "text-recognizer")
    assert items_after - items == lines and batches_after - batches <= lines / 4  # batches, not a run a line


def test_v2_answers_the_lines_as_json(stack, pages, reference):
    import tritonclient.http as httpclient

    triton = httpclient.InferenceServerClient(stack.url.removeprefix("http://"))
    given = httpclient.InferInput("IMAGE", [1], "BYTES")
    given.set_data_from_numpy(np.array([pages["5 lines"]], dtype=object), binary_data=True)
    (document,) = triton.infer("ocr", [given]).as_numpy("lines")
    assert_same_lines(json.loads(document), theirs(reference, pages["5 lines"]))


def test_a_bulk_job_reads_pages_as_v1_does(stack, pages, reference):
    from funnel_client import Client

    client = Client(stack.url)
    job = client.submit_job("ocr", images=[pages["5 lines"], pages["scanned"]])
    assert client.wait(job["id"], timeout=120)["state"] == "done"
    results = list(client.results(job["id"]))
    assert_same_lines(results[0]["lines"], theirs(reference, pages["5 lines"]))
    assert_same_lines(results[1]["lines"], theirs(reference, pages["scanned"]))


ONE_WORKER = "one-for-all"


@pytest.mark.parametrize("max_resident", ["0", "2"])
def test_one_worker_of_every_model_reads_as_rapidocr_alone_and_eight_at_once(stack, pages, reference, max_resident,
                                                                            tmp_path):
    """The chain and its three steps on one worker (`--models '*'`), all resident or two at a time."""
    images = [pages[name] for name in ("20 lines", "5 lines", "scanned", "upside down")] * 2
    with Stack(model_store=stack.model_store, workers=[], web_env=PATIENT, log_dir=tmp_path) as alone:
        alone.start_worker("ocr", FUNNEL_MODELS="*", FUNNEL_MAX_RESIDENT=max_resident)
        alone.wait_ready(60, expected=dict.fromkeys(OCR_MODELS, 1))
        assert_same_lines(read(alone, pages["5 lines"])["lines"], theirs(reference, pages["5 lines"]))
        with concurrent.futures.ThreadPoolExecutor(len(images)) as pool:
            answers = list(pool.map(lambda image: read(alone, image), images))
    for image, answer in zip(images, answers):
        assert_same_lines(answer["lines"], theirs(reference, image))


def test_the_only_worker_killed_mid_page_loses_nothing_once_back(stack, pages, reference, tmp_path):
    with Stack(model_store=stack.model_store, workers=[], web_env=PATIENT, log_dir=tmp_path) as alone:
        worker = alone.start_worker("ocr", FUNNEL_MODELS="*", FUNNEL_WORKER_ID=ONE_WORKER)
        alone.wait_ready(60, expected=dict.fromkeys(OCR_MODELS, 1))
        client = redis.Redis.from_url(alone.redis_url)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(read, alone, pages["20 lines"])
            wait_for(lambda: any(client.llen(key) for key in scan_keys(client, "funnel:inflight:*")),
                     what="the worker holding the page's jobs")
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            alone.start_worker("ocr", FUNNEL_MODELS="*", FUNNEL_WORKER_ID=ONE_WORKER)  # claims what it held
            answer = asked.result(timeout=130)
    assert_same_lines(answer["lines"], theirs(reference, pages["20 lines"]))
