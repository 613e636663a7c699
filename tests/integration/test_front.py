"""web/transport/front.py and web/pipeline.py: every predict-like request takes the one pipeline.

A stack with a text worker and no image worker gets requests good and bad;
each answer has its status, its error code and the headers a client acts on.
In-process, a spy on the pipeline's prepare step shows that a /v1 predict, a
/v2 infer and a bulk job's items all pass through it, under the server's own
ASGI app and uvicorn.
"""

from __future__ import annotations

import threading

import pytest
import uvicorn

from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from funnel.web import server
from funnel.web.pipeline import Pipeline
from funnel.web.settings import WebSettings
from funnel.web.transport.protocol import Protocol
from tests.support import http, metric, multipart, wait_for

KEY = "front-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"Content-Type": "application/json", **AUTH}
TEXT = "/v1/models/text-embedding/predict"
IMAGE = "/v1/models/image-classifier/predict"
INFER = "/v2/models/text-embedding/infer"


def requests(cat_jpeg: bytes) -> list[tuple[str, str, bytes, dict, int, str | None]]:
    """(label, route, body, headers, status, error code)."""
    upload, upload_headers = multipart("file", "cat.jpg", cat_jpeg)
    return [
        ("one text", TEXT, b'{"text": "A man is eating food."}', JSON, 200, None),
        ("texts in order", TEXT, b'{"texts": ["first", "a second text", "third"]}', JSON, 200, None),
        ("empty text", TEXT, b'{"text": "  "}', JSON, 400, "empty_input"),
        ("one bad text among good", TEXT, b'{"texts": ["fine", ""]}', JSON, 400, "empty_input"),
        ("not a string", TEXT, b'{"text": 5}', JSON, 400, "bad_json"),
        ("both keys", TEXT, b'{"text": "a", "texts": ["b"]}', JSON, 400, "bad_json"),
        ("broken JSON", TEXT, b'{"text": ', JSON, 400, "bad_json"),
        ("JSON not an object", TEXT, b'["a"]', JSON, 400, "bad_json"),
        ("too many texts", TEXT, b'{"texts": [' + b",".join([b'"t"'] * 65) + b"]}", JSON, 400, "too_many_items"),
        ("too long", TEXT, b'{"text": "' + b"a" * 30_000 + b'"}', JSON, 400, "text_too_long"),
        ("wrong content type", TEXT, b'{"text": "a"}', {"Content-Type": "text/plain", **AUTH}, 415,
         "unsupported_media_type"),
        ("body over the limit", TEXT, b'{"text": "' + b"a" * 600_000 + b'"}', JSON, 413,
         "request_entity_too_large"),
        ("bad X-Request-Timeout", TEXT, b'{"text": "a"}', {**JSON, "X-Request-Timeout": "soon"}, 400, "bad_timeout"),
        ("image, multipart, no worker", IMAGE, upload, {**upload_headers, **AUTH}, 503, "no_worker"),
        ("image, raw body, no worker", IMAGE, cat_jpeg, {"Content-Type": "image/jpeg", **AUTH}, 503, "no_worker"),
        ("not an image", IMAGE, b"GIF89a not really", {"Content-Type": "image/gif", **AUTH}, 400, "not_an_image"),
        ("multipart without file", IMAGE, upload.replace(b'name="file"', b'name="other"'),
         {**upload_headers, **AUTH}, 400, "missing_file"),
        ("no API key", TEXT, b'{"text": "a"}', {"Content-Type": "application/json"}, 401, "unauthorized"),
        ("wrong API key", TEXT, b'{"text": "a"}', {"Content-Type": "application/json", "Authorization": "Bearer x"},
         401, "unauthorized"),
        ("unknown model", "/v1/models/nope/predict", b'{"text": "a"}', JSON, 404, "unknown_model"),
        ("webhook without async (the job routes answer)", TEXT, b'{"text": "a"}',
         {**JSON, "Webhook-URL": "https://example.com/hook"}, 400, "bad_webhook"),
        ("v2: one sentence", INFER, b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], '
         b'"data": ["A man is eating food."]}]}', JSON, 200, None),
        ("v2: no API key", INFER, b'{}', {"Content-Type": "application/json"}, 401, None),
        ("v2: unknown version", "/v2/models/text-embedding/versions/7/infer", b'{}', JSON, 404, None),
        ("v2: not JSON", INFER, b'{"inputs": ', JSON, 400, None),
    ]


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    # No image worker: a good image gets the 503 (no_worker, Retry-After).
    with Stack(model_store=model_store, web_env={"FUNNEL_API_KEYS": KEY, "FUNNEL_MAX_BODY_MB": "0.5"},
               workers=["text-embedding"], log_dir=tmp_path_factory.mktemp("front")) as running:
        yield running


def test_every_answer_has_its_status_code_and_headers(stack, cat_jpeg):
    statuses = set()
    for label, route, body, headers, status, code in requests(cat_jpeg):
        got, answer, answer_headers = http("POST", stack.url + route, body=body, headers=headers)
        assert got == status, (label, answer)
        assert answer_headers["Content-Type"] == "application/json", label
        if route == INFER and status != 200:  # the Open Inference Protocol's error shape: a string
            assert isinstance(answer["error"], str) and answer["error"], (label, answer)
        elif code:
            assert answer["error"]["code"] == code, (label, answer)
        if status == 503:
            assert answer_headers["Retry-After"] == "5", label
        if status == 401:
            assert answer_headers["WWW-Authenticate"] == "Bearer", label
        statuses.add(got)
    assert statuses == {200, 400, 401, 404, 413, 415, 503}


def test_another_method_on_a_predict_path_is_a_405_in_its_protocols_shape(stack):
    for method in ("GET", "PUT", "DELETE", "HEAD"):
        for route in (TEXT, INFER, "/v1/embeddings", "/v1/models/nope/predict"):
            status, answer, headers = http(method, stack.url + route, headers=AUTH)
            assert status == 405 and headers["Allow"] == "POST", (method, route, answer)
            assert headers["X-Request-ID"], (method, route)
            if method == "HEAD":
                assert answer == {"_text": ""}, route  # no body
            elif route == INFER:
                assert isinstance(answer["error"], str), answer
            elif route == "/v1/embeddings":
                assert answer["error"]["type"] == "invalid_request_error", answer
            else:
                assert answer["error"]["code"] == "method_not_allowed", answer
    status, _, headers = http("DELETE", stack.url + "/v1/models", headers=AUTH)  # Flask's, with its Allow
    assert status == 405 and "GET" in headers["Allow"]


def test_several_items_answer_in_order_and_a_bad_one_is_named(stack):
    status, body, _ = http("POST", stack.url + TEXT, body=b'{"texts": ["first", "second"]}', headers=JSON)
    assert status == 200 and len(body["results"]) == len(body["meta"]) == 2
    status, body, _ = http("POST", stack.url + TEXT, body=b'{"texts": ["fine", ""]}', headers=JSON)
    assert status == 400 and body["error"]["message"].startswith("item 1: "), body


@pytest.mark.parametrize(("label", "chunks", "status"), [
    ("a chunked body", [b'{"texts": ["in two', b' chunks", "second"]}'], 200),
    ("an empty chunked body", [], 400),
])
def test_chunked_bodies(stack, label, chunks, status):
    """No Content-Length: the body's length is only known at its end (urllib sends an iterable chunked)."""
    got, body, _ = http("POST", stack.url + TEXT, body=iter(chunks), headers=JSON)
    assert got == status, (label, body)


def test_a_chunked_body_past_the_limit_is_a_413(stack):
    status, body, _ = http("POST", stack.url + TEXT, body=iter([b'{"text": "'] + [b"a" * 100_000] * 6 + [b'"}']),
                           headers=JSON)
    assert status == 413 and body["error"]["code"] == "request_entity_too_large", body


def test_an_async_predict_becomes_a_job(stack):
    status, body, headers = http("POST", stack.url + TEXT, body=b'{"text": "later"}',
                                 headers={**JSON, "Prefer": "respond-async"})
    assert status == 202 and headers["Preference-Applied"] == "respond-async", body
    assert body["id"]


def test_answers_are_counted_in_the_metrics(stack):
    def count(text: str, route_model: str, status: str) -> float:
        return metric(text, "funnel_requests_total", model=route_model, status=status)

    before = http("GET", stack.url + "/metrics", headers=AUTH)[1]["_text"]
    for _ in range(3):
        assert http("POST", stack.url + TEXT, body=b'{"text": "counted"}', headers=JSON)[0] == 200
    assert http("POST", stack.url + TEXT, body=b'{"text": ""}', headers=JSON)[0] == 400
    assert http("POST", stack.url + "/v1/models/nope/predict", body=b'{"text": "a"}', headers=JSON)[0] == 404
    after = http("GET", stack.url + "/metrics", headers=AUTH)[1]["_text"]
    assert count(after, "text-embedding", "200") == count(before, "text-embedding", "200") + 3
    assert count(after, "text-embedding", "400") == count(before, "text-embedding", "400") + 1
    assert count(after, "unknown", "404") >= 1
    assert metric(after, "funnel_queue_wait_seconds_count", model="text-embedding") >= 3


@pytest.fixture
def in_process(stack, monkeypatch):
    """The server's own ASGI app, served by uvicorn in this process against the stack's Redis and
    worker, with every call of Pipeline.prepare recorded: (model, items)."""
    calls: list[tuple[str, list]] = []
    prepare = Pipeline.prepare

    def spy(self, task, items, ready=False, owner=""):
        calls.append((task.spec.name, list(items)))
        return prepare(self, task, items, ready, owner)

    monkeypatch.setattr(Pipeline, "prepare", spy)
    settings = WebSettings.load(["--redis-url", stack.redis_url, "--model-store", stack.model_store,
                                 "--models", "text-embedding"])
    port = free_port()
    config = uvicorn.Config(server.application(settings), host="127.0.0.1", port=port, loop="uvloop",
                            http=Protocol, lifespan="off", log_level="warning")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    def alive() -> None:
        assert thread.is_alive(), "uvicorn did not start"
    wait_for(lambda: served.started, timeout_s=30, interval_s=0.02, what="uvicorn to start", check=alive)
    yield f"http://127.0.0.1:{port}", calls
    served.should_exit = True
    thread.join(10)


def test_v1_v2_and_a_jobs_items_take_the_same_pipeline(in_process):
    url, calls = in_process
    status, body, _ = http("POST", url + TEXT, json_body={"text": "through v1"})
    assert status == 200 and len(body["embedding"]) == 384, body
    status, body, _ = http("POST", url + INFER, json_body={
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["through v2"]}]})
    assert status == 200 and body["outputs"][0]["shape"] == [1, 384], body
    status, body, _ = http("POST", url + "/v1/models/text-embedding/jobs",
                           json_body={"texts": ["a job's first", "a job's second"]})
    assert status == 202, body
    assert calls == [("text-embedding", ["through v1"]), ("text-embedding", ["through v2"]),
                     ("text-embedding", ["a job's first", "a job's second"])]
    def done() -> dict | None:
        job = http("GET", url + f"/v1/jobs/{body['id']}")[1]
        return job if job["state"] == "done" else None
    job = wait_for(done, timeout_s=30, interval_s=0.05, what="the job to be done")
    assert [len(r["embedding"]) for r in job["results"]] == [384, 384]
