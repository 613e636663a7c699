"""web/predict.py and web/asgi.py: the common predict answered without Flask's machinery, as Flask answers it.

Three stacks, each with a text worker and no image worker: the asgi worker
class (the default: the predict on the event loop), gthread with the predict
path, and gthread without it (FUNNEL_PREDICT_PATH=0: Flask answers every
request). They get the same requests, good and bad, and every answer must
match Flask's in status, body (less the per-run meta), content type and the
headers a client acts on. In-process, Flask's request_started signal shows
which requests the path took and which it left to Flask.
"""

from __future__ import annotations

import pytest
from flask import request_started

from funnel.scripts.stack import Stack
from funnel.web.app import create_app
from funnel.web.predict import PredictPath
from funnel.web.settings import WebSettings
from tests.conftest import http, metric, multipart

KEY = "predict-path-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"Content-Type": "application/json", **AUTH}
TEXT = "/v1/models/text-embedding/predict"
IMAGE = "/v1/models/image-classifier/predict"
# Headers a client acts on; Date and Server differ between any two answers.
COMPARED = ("Content-Type", "Retry-After", "WWW-Authenticate", "Preference-Applied")


def requests(cat_jpeg: bytes) -> list[tuple[str, str, bytes, dict]]:
    upload, upload_headers = multipart("file", "cat.jpg", cat_jpeg)
    return [
        ("one text", TEXT, b'{"text": "A man is eating food."}', JSON),
        ("texts in order", TEXT, b'{"texts": ["first", "a second text", "third"]}', JSON),
        ("empty text", TEXT, b'{"text": "  "}', JSON),
        ("one bad text among good", TEXT, b'{"texts": ["fine", ""]}', JSON),
        ("not a string", TEXT, b'{"text": 5}', JSON),
        ("both keys", TEXT, b'{"text": "a", "texts": ["b"]}', JSON),
        ("broken JSON", TEXT, b'{"text": ', JSON),
        ("JSON not an object", TEXT, b'["a"]', JSON),
        ("too many texts", TEXT, b'{"texts": [' + b",".join([b'"t"'] * 65) + b"]}", JSON),
        ("too long", TEXT, b'{"text": "' + b"a" * 30_000 + b'"}', JSON),
        ("wrong content type", TEXT, b'{"text": "a"}', {"Content-Type": "text/plain", **AUTH}),
        ("body over the limit", TEXT, b'{"text": "' + b"a" * 600_000 + b'"}', JSON),
        ("bad X-Request-Timeout", TEXT, b'{"text": "a"}', {**JSON, "X-Request-Timeout": "soon"}),
        ("image, multipart", IMAGE, upload, {**upload_headers, **AUTH}),
        ("image, raw body", IMAGE, cat_jpeg, {"Content-Type": "image/jpeg", **AUTH}),
        ("not an image", IMAGE, b"GIF89a not really", {"Content-Type": "image/gif", **AUTH}),
        ("multipart without file", IMAGE, upload.replace(b'name="file"', b'name="other"'),
         {**upload_headers, **AUTH}),
        ("no API key (Flask answers)", TEXT, b'{"text": "a"}', {"Content-Type": "application/json"}),
        ("wrong API key (Flask answers)", TEXT, b'{"text": "a"}',
         {"Content-Type": "application/json", "Authorization": "Bearer nope"}),
        ("unknown model (Flask answers)", "/v1/models/nope/predict", b'{"text": "a"}', JSON),
        ("webhook without async (Flask answers)", TEXT, b'{"text": "a"}',
         {**JSON, "Webhook-URL": "https://example.com/hook"}),
    ]


@pytest.fixture(scope="module")
def stacks(model_store, tmp_path_factory):
    """(asgi, gthread with the path, Flask alone)."""
    env = {"FUNNEL_API_KEYS": KEY, "FUNNEL_MAX_BODY_MB": "0.5"}
    logs = tmp_path_factory.mktemp("predict-path")
    # No image worker: a good image gets the 503 (no_worker, Retry-After) every way.
    with Stack(model_store=model_store, web_env=env, workers=["text-embedding"], log_dir=logs / "asgi") as asgi, \
            Stack(model_store=model_store, web_env={**env, "FUNNEL_WORKER_CLASS": "gthread"},
                  workers=["text-embedding"], log_dir=logs / "path") as path, \
            Stack(model_store=model_store, web_env={**env, "FUNNEL_WORKER_CLASS": "gthread",
                                                    "FUNNEL_PREDICT_PATH": "0"},
                  workers=["text-embedding"], log_dir=logs / "flask") as flask:
        yield asgi, path, flask


def comparable(value):
    """An answer less its per-run meta, floats to 5 places (two worker processes, one model)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k != "meta"}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return round(value, 5) if isinstance(value, float) else value


@pytest.mark.parametrize("way", ["asgi", "gthread"])
def test_every_answer_matches_flasks(stacks, cat_jpeg, way):
    ours_stack, flask = stacks[0 if way == "asgi" else 1], stacks[2]
    statuses = set()
    for label, route, body, headers in requests(cat_jpeg):
        ours, theirs = (http("POST", s.url + route, body=body, headers=headers) for s in (ours_stack, flask))
        assert ours[0] == theirs[0], label
        assert comparable(ours[1]) == comparable(theirs[1]), label
        assert {h: ours[2].get(h) for h in COMPARED} == {h: theirs[2].get(h) for h in COMPARED}, label
        statuses.add(ours[0])
    assert statuses == {200, 400, 401, 404, 413, 415, 503}  # the table reaches every kind of answer


@pytest.mark.parametrize(("label", "chunks", "status"), [
    ("a chunked body", [b'{"texts": ["in two', b' chunks", "second"]}'], 200),
    ("an empty chunked body", [], 400),
])
def test_chunked_bodies_match_flasks(stacks, label, chunks, status):
    """No Content-Length: the body's length is only known at its end (urllib sends an iterable chunked)."""
    asgi, _, flask = stacks
    answers = [http("POST", s.url + TEXT, body=iter(chunks), headers=JSON) for s in (asgi, flask)]
    assert answers[0][0] == answers[1][0] == status, (label, answers[0][1], answers[1][1])
    assert comparable(answers[0][1]) == comparable(answers[1][1]), label


def test_a_chunked_body_past_the_limit_is_a_413(stacks):
    # Flask under gthread reads such a body cut at the limit, so it answers 400 bad_json instead.
    status, body, _ = http("POST", stacks[0].url + TEXT, body=iter([b'{"text": "'] + [b"a" * 100_000] * 6 + [b'"}']),
                           headers=JSON)
    assert status == 413 and body["error"]["code"] == "request_entity_too_large", body


def test_an_async_predict_still_becomes_a_job(stacks):
    for stack in stacks[:2]:
        status, body, headers = http("POST", stack.url + TEXT, body=b'{"text": "later"}',
                                     headers={**JSON, "Prefer": "respond-async"})
        assert status == 202 and headers["Preference-Applied"] == "respond-async", body
        assert body["id"]


@pytest.mark.parametrize("way", ["asgi", "gthread"])
def test_answers_are_counted_in_the_metrics(stacks, way):
    path = stacks[0 if way == "asgi" else 1]
    _, metrics_before, _ = http("GET", path.url + "/metrics", headers=AUTH)
    before = metric(metrics_before["_text"], "funnel_requests_total", model="text-embedding", status="200")
    for _ in range(3):
        assert http("POST", path.url + TEXT, body=b'{"text": "counted"}', headers=JSON)[0] == 200
    assert http("POST", path.url + TEXT, body=b'{"text": ""}', headers=JSON)[0] == 400
    text = http("GET", path.url + "/metrics", headers=AUTH)[1]["_text"]
    assert metric(text, "funnel_requests_total", model="text-embedding", status="200") == before + 3
    assert metric(text, "funnel_requests_total", model="text-embedding", status="400") >= 1
    assert metric(text, "funnel_queue_wait_seconds_count", model="text-embedding") >= 3


@pytest.mark.parametrize(("headers", "flask_answers"), [
    ({}, False),
    ({"Prefer": "respond-async"}, True),
    ({"Webhook-URL": "https://example.com/hook"}, True),
])
def test_the_path_leaves_jobs_to_flask(redis_server, model_store, headers, flask_answers):
    settings = WebSettings.load(["--redis-url", redis_server.url, "--model-store", str(model_store),
                                 "--models", "text-embedding", "--prefix", "predict-path-test"])
    app = create_app(settings)
    assert isinstance(app.wsgi_app, PredictPath)
    seen = []

    def started(sender, **extra):
        seen.append(1)

    with request_started.connected_to(started, app):
        # No worker serves the model in this Redis: a 503 either way, which is enough to tell.
        answer = app.test_client().post(TEXT, json={"text": "who answers?"}, headers=headers)
    assert answer.status_code in (202, 400, 503), answer.json
    assert bool(seen) == flask_answers
