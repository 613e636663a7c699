"""Models in sequence: a chain is a served model whose steps are other served models, run on their queues.

The chain of docs/models.md, "Chains" (tests/third_party/labelwords): an image's top labels from the
image classifier, then each label's embedding from the text model (a fan-out), answered as one
result. Its answers equal the two models asked by hand; its fan-out rides the text model's batches;
a step's failure, a deadline and a client that leaves each stop what they should and nothing else.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import scan_keys
from funnel.scripts.prepare_model import DEFAULT_MODELS
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import http, multipart, wait_for, worker_totals
from tests.toy_model import funnel

CHAIN = "label-words"
EACH = "each-score"  # toyscore's EachScore: each vector of a list scored by py-score


@pytest.fixture(scope="module")
def store(model_store, tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("chain-store")
    for name in DEFAULT_MODELS:
        (store / name).symlink_to(model_store / name, target_is_directory=True)
    done = funnel("add", CHAIN, "--store", str(store), "--task", "labelwords.tasks:LabelWords",
                  "--steps", "image-classifier,text-embedding", "--set", "labels=3", "--batch-size", "8",
                  env=toy_model.outside_env())
    assert done.returncode == 0, done.stderr
    # a fan-out of the toy scorer run in Python (tests/third_party/toyscore): its inputs that fail, hang
    # or crash, and a pace, so that a request of many vectors lasts a while
    work = tmp_path_factory.mktemp("chain-work")
    toy_model.add_python(store, work, "py-score", "--set", "pace_batch_s=0.1", "--set", "predict_timeout_s=3",
                         "--batch-size", "4")
    done = funnel("add", EACH, "--store", str(store), "--task", "toyscore.tasks:EachScore", "--steps", "py-score",
                  env=toy_model.outside_env())
    assert done.returncode == 0, done.stderr
    return store


@pytest.fixture(scope="module")
def stack(store):
    with toy_model.outside_stack(store) as running:
        yield running


def upload(stack, model: str, image: bytes, headers: dict | None = None):
    body, form = multipart("file", "cat.jpg", image, "image/jpeg")
    return http("POST", f"{stack.url}/v1/models/{model}/predict", body, {**form, **(headers or {})})


def test_funnel_add_wants_steps_for_a_chain_and_only_for_one(store):
    done = funnel("add", "no-steps", "--store", str(store), "--task", "labelwords.tasks:LabelWords",
                  env=toy_model.outside_env())
    assert done.returncode != 0 and "--steps" in done.stderr
    done = funnel("add", "not-a-chain", "--store", str(store), "--task", "toyscore.tasks:PythonScore",
                  "--steps", "text-embedding", env=toy_model.outside_env())
    assert done.returncode != 0 and "no Chain" in done.stderr


def test_funnel_add_refuses_steps_not_in_the_store_unless_they_are_to_come(store):
    steps = ["text-embedding", "not-yet", "image-classifier:7"]
    done = funnel("add", "early-chain", "--store", str(store), "--task", "labelwords.tasks:LabelWords",
                  "--steps", ",".join(steps), env=toy_model.outside_env())
    assert done.returncode != 0 and "not-yet, image-classifier:7 are not in" in done.stderr, done.stderr
    assert not (store / "early-chain").exists()
    done = funnel("add", "early-chain", "--store", str(store), "--task", "labelwords.tasks:LabelWords",
                  "--steps", ",".join(steps), "--steps-to-come", env=toy_model.outside_env())
    assert done.returncode == 0, done.stderr
    shutil.rmtree(store / "early-chain")  # the module's stack serves the store: nothing of it stays


def test_the_chain_answers_what_its_two_models_answer_by_hand(stack, cat_jpeg):
    status, answer, _ = upload(stack, CHAIN, cat_jpeg)
    assert status == 200, answer
    status, classes, _ = upload(stack, "image-classifier", cat_jpeg)
    assert status == 200
    labels = answer["labels"]
    assert [entry["label"] for entry in labels] == [p["label"] for p in classes["predictions"][:3]]
    for entry in labels:
        status, embedded, _ = http("POST", f"{stack.url}/v1/models/text-embedding/predict",
                                   json_body={"text": entry["label"]})
        assert status == 200
        np.testing.assert_allclose(entry["embedding"], embedded["embedding"], atol=1e-5)


def test_the_registry_lists_the_chain_as_served_by_a_chain_worker(stack):
    status, listing, _ = http("GET", f"{stack.url}/v1/models")
    assert status == 200
    (chain,) = [m for m in listing["models"] if m["name"] == CHAIN]
    assert chain["workers"] and all(w.get("backend") == "chain" for w in chain["workers"]), chain


def test_concurrent_chains_fan_out_into_the_text_models_shared_batches(stack, cat_jpeg):
    batches, items = worker_totals(stack, "text-embedding")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: upload(stack, CHAIN, cat_jpeg), range(16)))
    assert all(status == 200 for status, _, _ in answers), [a for s, a, _ in answers if s != 200]
    first = answers[0][1]
    for _, answer, _ in answers:  # the same image, the same labels and embeddings, whatever batch each rode
        assert [e["label"] for e in answer["labels"]] == [e["label"] for e in first["labels"]]
        np.testing.assert_allclose([e["embedding"] for e in answer["labels"]],
                                   [e["embedding"] for e in first["labels"]], atol=1e-5)
    # 48 labels embedded (3 a request), counted as each worker's heartbeat publishes its counters
    wait_for(lambda: worker_totals(stack, "text-embedding")[1] >= items + 48, timeout_s=30,
             what="the text model's workers to count the fan-out's items")
    batches_after, items_after = worker_totals(stack, "text-embedding")
    assert batches_after - batches < items_after - items  # the fan-outs shared batches


def score_each(stack, vectors: list, headers: dict | None = None):
    return http("POST", f"{stack.url}/v1/models/{EACH}/predict", json_body={"input": vectors},
                headers=headers)


def test_an_element_the_step_fails_answers_its_error_in_place_and_the_rest(stack):
    vectors = [[1, 2, 3, 4], [666, 0, 0, 0], [777, 0, 0, 0], [0.5, -1, 2, 0]]
    status, answer, _ = score_each(stack, vectors)
    assert status == 200, answer
    each = answer["each"]
    assert each[1]["error"]["code"] == "refused_by_model" and each[1]["error"]["status"] == 400
    assert each[2]["error"]["status"] == 500
    for i in (0, 3):
        status, alone, _ = http("POST", f"{stack.url}/v1/models/py-score/predict", json_body={"input": vectors[i]})
        assert status == 200
        np.testing.assert_allclose(each[i]["scores"], alone["scores"], atol=1e-6)


def test_a_step_past_the_requests_deadline_ends_the_request_and_not_the_chain(stack):
    status, answer, _ = score_each(stack, [[1, 2, 3, 4], [999, 0, 0, 0]], {"X-Request-Timeout": "1"})
    assert status == 504, answer  # the hung element outlasts the request
    status, answer, _ = score_each(stack, [[1, 2, 3, 4]])  # the chain's worker serves on
    assert status == 200, answer


def test_a_client_that_leaves_has_its_steps_not_yet_run_dropped(stack):
    import redis

    from funnel.common.contracts import registry
    from funnel.common.contracts.keys import Keys

    client = redis.Redis.from_url(stack.redis_url)

    def left() -> float:
        return sum(registry.counter(w, "left") for w in registry.live_workers(client, Keys())
                   if w.get("model") == "py-score")

    before = left()
    body = json.dumps({"input": [[1, 2, 3, i] for i in range(40)]}).encode()  # ten batches of four, 0.1 s each
    port = int(stack.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /v1/models/%s/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (EACH.encode(), len(body), body))
        wait_for(lambda: client.llen(Keys().queue("py-score")) > 0, what="the fan-out queued")
    # the web tier marks the chain's job gone; its worker marks its step jobs; py-score's worker drops them
    wait_for(lambda: left() >= before + 20, timeout_s=30, what="the steps not yet run dropped")


@pytest.mark.parametrize("max_resident", ["0", "1"])
def test_one_worker_of_every_model_answers_the_chain_as_separate_workers_do(store, stack, cat_jpeg, max_resident,
                                                                              tmp_path):
    """A chain and its steps on one worker (`--models '*'`): the chain's batch runs on a thread of its own
    while the worker takes its steps' jobs; with one model resident at most (a chain takes no room), each
    step is loaded in turn, evicting the other."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        expected = list(pool.map(lambda _: upload(stack, CHAIN, cat_jpeg), range(8)))  # separate workers'
    env = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}
    with Stack(model_store=store, web_env=env, worker_env=env, workers=[], log_dir=tmp_path) as alone:
        alone.start_worker(CHAIN, FUNNEL_MODELS="*", FUNNEL_MAX_RESIDENT=max_resident)
        alone.wait_ready(60, expected=dict.fromkeys([CHAIN, *DEFAULT_MODELS], 1))
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: upload(alone, CHAIN, cat_jpeg), range(8)))
    for (status, answer, _), (_, theirs, _) in zip(answers, expected):
        assert status == 200, answer
        assert [e["label"] for e in answer["labels"]] == [e["label"] for e in theirs["labels"]]
        np.testing.assert_allclose([e["embedding"] for e in answer["labels"]],
                                   [e["embedding"] for e in theirs["labels"]], atol=1e-5)



def test_sigterm_to_one_worker_of_every_model_answers_the_chain_under_way(store, cat_jpeg, tmp_path):
    """Told to stop, the worker takes no more of the chain's work, but its steps' until the chain's
    batch under way is answered; then it exits 0."""
    env = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}
    held = {**env, "FUNNEL_HOLD_WITHOUT_WORKERS": "1"}  # the requests wait queued for the worker to come
    with Stack(model_store=store, web_env=held, worker_env=env, workers=[], log_dir=tmp_path) as alone:
        client = redis.Redis.from_url(alone.redis_url)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            asked = [pool.submit(upload, alone, CHAIN, cat_jpeg) for _ in range(4)]
            wait_for(lambda: client.llen(Keys().queue(CHAIN)) == 4, what="the four requests queued")
            worker = alone.start_worker(CHAIN, FUNNEL_MODELS="*")
            wait_for(lambda: client.llen(Keys().queue(CHAIN)) == 0 and any(
                client.llen(key) for key in scan_keys(client, Keys().inflight_pattern(CHAIN))),
                what="the four taken, as the chain's one batch under way")
            worker.send_signal(signal.SIGTERM)
            answers = [future.result(timeout=60) for future in asked]
        assert worker.wait(timeout=60) == 0
    assert [status for status, _, _ in answers] == [200] * 4, answers
