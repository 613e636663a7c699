"""The whole stack as a user starts it: Redis, gunicorn web tier, one worker process per model."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis

from funnel.scripts.stack import Stack
from tests.support import ROOT, http, multipart

CAT_CLASSES = {281, 282, 283, 284, 285, 286, 287}  # tabby .. lynx


@pytest.fixture(scope="module", params=["onnx", "torch"])
def stack(request, model_store, tmp_path_factory):
    logs = tmp_path_factory.mktemp(f"stack-{request.param}")
    with Stack(model_store=model_store, worker_env={"FUNNEL_BACKEND": request.param},
               log_dir=logs) as running:
        yield running


def predict(stack, model, **kwargs):
    return http("POST", f"{stack.url}/v1/models/{model}/predict", **kwargs)


def embed(stack, text):
    status, body, _ = predict(stack, "text-embedding", json_body={"text": text})
    assert status == 200, body
    return np.array(body["embedding"])


def test_cat_photo_as_multipart(stack, cat_jpeg):
    body, headers = multipart("file", "cat.jpg", cat_jpeg)
    status, result, _ = predict(stack, "image-classifier", body=body, headers=headers)
    assert status == 200, result
    top = result["predictions"]
    assert len(top) == 5 and top[0]["index"] in CAT_CLASSES
    assert "cat" in top[0]["label"]
    assert top[0]["probability"] >= top[1]["probability"]
    assert result["meta"]["worker"]  # answered by a worker process, through Redis


def test_image_as_raw_body(stack, coffee_jpeg):
    status, result, _ = predict(stack, "image-classifier", body=coffee_jpeg,
                                headers={"Content-Type": "image/jpeg"})
    assert status == 200 and result["predictions"][0]["label"] == "espresso"


def test_sentence_similarity(stack):
    food, bread, baby = (embed(stack, t) for t in [
        "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."])
    assert food.shape == (384,)
    assert np.linalg.norm(food) == pytest.approx(1.0, abs=1e-4)
    assert food @ bread > food @ baby
    assert food @ bread == pytest.approx(0.755, abs=0.01)


def test_many_texts_in_one_request_keep_their_order(stack):
    texts = ["first text", "a second, longer text about something else", "third"]
    status, body, _ = predict(stack, "text-embedding", json_body={"texts": texts})
    assert status == 200 and len(body["results"]) == 3
    for text, result in zip(texts, body["results"]):
        np.testing.assert_allclose(result["embedding"], embed(stack, text), atol=1e-5)


def test_service_routes(stack):
    status, health, _ = http("GET", f"{stack.url}/healthz")
    assert status == 200 and health["status"] == "ok"
    status, listing, _ = http("GET", f"{stack.url}/v1/models")
    served = {m["name"]: m for m in listing["models"]}
    assert set(served) == {"image-classifier", "text-embedding"}
    assert served["text-embedding"]["workers"][0]["backend"] == stack.worker_env["FUNNEL_BACKEND"]
    status, page, _ = http("GET", f"{stack.url}/")
    assert status == 200 and 'type="file"' in page["_text"] and "<textarea" in page["_text"]
    # A static file goes out whole, headers first (web/response.py holds them for the first body bytes).
    script = (ROOT / "web" / "static" / "funnel.js").read_bytes()
    status, served_script, headers = http("GET", f"{stack.url}/static/funnel.js")
    assert status == 200 and served_script["_text"].encode() == script
    assert int(headers["Content-Length"]) == len(script)
    status, _, headers = http("HEAD", f"{stack.url}/healthz")
    assert status == 200 and headers["Content-Type"] == "application/json"


def test_concurrent_requests_get_their_own_answers(stack):
    """200 distinct texts from 32 threads at once: each gets the embedding it gets alone."""
    if stack.worker_env["FUNNEL_BACKEND"] != "onnx":
        pytest.skip("the mapping is the stack's, not the backend's: checked once")
    texts = [f"request number {i}: {'lorem ipsum ' * (i % 7)}the end" for i in range(200)]
    alone = [embed(stack, t) for t in texts]
    with ThreadPoolExecutor(max_workers=32) as pool:
        together = list(pool.map(lambda t: predict(stack, "text-embedding", json_body={"text": t}), texts))
    batch_sizes = []
    for expected, (status, body, _) in zip(alone, together):
        assert status == 200, body
        np.testing.assert_allclose(body["embedding"], expected, atol=1e-5)
        batch_sizes.append(body["meta"]["batch_size"])
    assert max(batch_sizes) > 1  # they really were batched together


def test_torch_workers_run_on_tcmalloc(stack):
    from funnel.worker.allocator import tcmalloc_path

    if stack.worker_env["FUNNEL_BACKEND"] != "torch" or not tcmalloc_path():
        pytest.skip("tcmalloc is preloaded for the torch backend only, when libtcmalloc-minimal4 is installed")
    for worker in stack.workers:
        with open(f"/proc/{worker.pid}/maps") as maps:
            assert "tcmalloc" in maps.read()


def test_each_web_process_listens_on_one_inbox_per_model(stack):
    """After answering, a web process keeps one connection blocked on its inbox for
    each model it has served (one list per model: on a cluster each is in its model's slot)."""
    listeners = [c for c in redis.Redis.from_url(stack.redis_url).client_list() if c["cmd"] == "brpop"]
    assert 1 <= len(listeners) <= 2 * len(stack.models)  # FUNNEL_PROCESSES=2, each after its first request
