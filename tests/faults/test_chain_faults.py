"""A chain's steps killed mid-way: the OCR chain (common/tasks/ocr.py) under load while a worker of its
detection step, then one of its recognition step, then one of the chain itself is killed with SIGKILL,
each holding jobs. Every request is answered once, 200, with what RapidOCR() reads on the page."""

from __future__ import annotations

import concurrent.futures
import io
import signal
import threading

import numpy as np
import redis

from funnel.scripts.prepare_model import prepare
from funnel.scripts.stack import Stack
from tests.support import FAST_HEARTBEAT, freeze_holding_jobs, http, multipart, wait_for

MODELS = ("text-detector", "text-direction", "text-recognizer", "ocr")
REQUESTS = 24
CLIENTS = 4


def page() -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", (700, 260), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=22)
    for i, text in enumerate(["queued jobs wait in Redis", "a worker takes a batch", "killed mid-batch, nothing lost",
                              "a peer answers what it held", "every reply once"]):
        draw.text((40, 30 + 42 * i), text, fill="black", font=font)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_detection_recognition_and_chain_workers_killed_under_load_lose_nothing(tmp_path):
    from rapidocr_onnxruntime import RapidOCR

    image = page()
    expected = [(text, box) for box, text, _ in RapidOCR()(image)[0]]
    store = tmp_path / "store"
    for name in MODELS:
        prepare(store, name)
    body, form = multipart("file", "page.png", image, "image/png")
    with Stack(model_store=store, workers=[], log_dir=tmp_path / "logs", worker_env=FAST_HEARTBEAT) as stack:
        victims = {model: stack.start_worker(model, FUNNEL_WORKER_ID=f"{model}-victim")
                   for model in ("text-detector", "text-recognizer", "ocr")}
        for model in MODELS:
            stack.start_worker(model, FUNNEL_WORKER_ID=f"{model}-survivor")
        stack.wait_ready(120, expected={"text-detector": 2, "text-recognizer": 2, "ocr": 2, "text-direction": 1})
        client = redis.Redis.from_url(stack.redis_url)
        answers: list[tuple[int, dict]] = []
        lock = threading.Lock()

        def one(_):
            status, answer, _ = http("POST", f"{stack.url}/v1/models/ocr/predict", body,
                                     {**form, "X-Request-Timeout": "120"}, timeout=130)
            with lock:
                answers.append((status, answer))

        held = {}
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            sent = [pool.submit(one, i) for i in range(REQUESTS)]
            for kills, (model, victim) in enumerate(victims.items()):  # each while it holds jobs, answers apart
                wait_for(lambda kills=kills: len(answers) >= 4 * (kills + 1), timeout_s=120, what="answers coming")
                held[model] = freeze_holding_jobs(client, victim, f"{model}-victim", timeout_s=60, model=model)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
            for future in sent:
                future.result()
    assert all(n > 0 for n in held.values()), held
    assert len(answers) == REQUESTS
    assert all(status == 200 for status, _ in answers), [a for s, a in answers if s != 200][:3]
    for _, answer in answers:
        assert [line["text"] for line in answer["lines"]] == [text for text, _ in expected]
        for line, (_, box) in zip(answer["lines"], expected):
            assert np.abs(np.asarray(line["box"]) - np.asarray(box)).max() <= 2
