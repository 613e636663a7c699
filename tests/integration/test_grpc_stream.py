"""gRPC ModelStreamInfer, driven by tritonclient.grpc's own stream API (`start_stream`, `async_stream_infer`).

Many requests on one bidirectional stream are each answered under their own id as soon as their items
are done, equal to a unary infer, and batched with each other; a request that fails answers its error on
the stream, which stays open; a stream cancelled with requests still queued has them dropped unrun.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests.support import PACED, one_paced_worker, wait_for, worker_totals

TEXT = "text-embedding"
STREAMED = 64


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], grpc_port=free_port(),
               log_dir=tmp_path_factory.mktemp("grpc-stream")) as running:
        yield running


def text_input(text: str):
    tensor = grpcclient.InferInput("TEXT", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return tensor


def stream(stack):
    """A client with a stream open: each answer (result, error) arrives on the returned queue."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    return client, answers


def test_many_requests_on_one_stream_are_each_answered_once_under_their_own_id(stack):
    texts = [f"stream sentence number {i}: {'lorem ipsum ' * (i % 5)}dolor" for i in range(STREAMED)]
    unary = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    expected = {text: unary.infer(TEXT, [text_input(text)]).as_numpy("embedding")[0] for text in texts[::8]}
    batches, items = worker_totals(stack, TEXT)
    client, answers = stream(stack)
    try:
        for i, text in enumerate(texts):
            client.async_stream_infer(TEXT, [text_input(text)], request_id=f"r{i}")
        got = [answers.get(timeout=60) for _ in texts]
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in got if error is not None] == []
    by_id = {result.get_response().id: result.as_numpy("embedding")[0] for result, _ in got}
    assert sorted(by_id) == sorted(f"r{i}" for i in range(STREAMED))  # each id once
    for i, text in enumerate(texts):
        if text in expected:
            np.testing.assert_allclose(by_id[f"r{i}"], expected[text], atol=1e-5)
    wait_for(lambda: worker_totals(stack, TEXT)[1] >= items + STREAMED, timeout_s=30,
             what="the workers to count the streamed items")
    batches_after, items_after = worker_totals(stack, TEXT)
    assert batches_after - batches < items_after - items  # batched together, not one run each


def test_a_failing_request_answers_its_error_and_the_stream_stays_open(stack):
    client, answers = stream(stack)
    try:
        client.async_stream_infer("no-such-model", [text_input("x")], request_id="bad")
        client.async_stream_infer(TEXT, [text_input("")], request_id="empty")
        client.async_stream_infer(TEXT, [text_input("after the errors")], request_id="good")
        got = [answers.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
        client.close()
    errors = sorted(str(error) for _, error in got if error is not None)
    assert len(errors) == 2 and any("no-such-model" in e for e in errors), errors
    (good,) = [result for result, error in got if error is None]
    assert good.get_response().id == "good" and good.as_numpy("embedding").shape == (1, 384)


@pytest.fixture(scope="module")
def paced(tmp_path_factory):
    with one_paced_worker(tmp_path_factory, PACED, {}, grpc_port=free_port()) as running:
        yield running


def paced_totals(stack) -> dict[str, float]:
    client = redis.Redis.from_url(stack.redis_url)
    (worker,) = [w for w in registry.live_workers(client, Keys()) if w.get("model") == PACED]
    return {name: registry.counter(worker, name) for name in ("items", "left")}


def test_a_cancelled_stream_has_its_queued_requests_dropped_unrun(paced):
    vector = grpcclient.InferInput("JSON", [1], "BYTES")
    vector.set_data_from_numpy(np.array([b"[1, 2, 3, 4]"], dtype=object))
    queue = redis.Redis.from_url(paced.redis_url)
    before = paced_totals(paced)
    client, answers = stream(paced)
    for i in range(60):  # three seconds of the paced worker's time
        client.async_stream_infer(PACED, [vector], request_id=f"p{i}")
    answers.get(timeout=30)  # under way
    queued = wait_for(lambda: queue.llen(Keys().queue(PACED)) >= 10 and queue.llen(Keys().queue(PACED)),
                      timeout_s=30, what="requests queued behind the paced worker")
    client.stop_stream(cancel_requests=True)
    client.close()
    wait_for(lambda: queue.llen(Keys().queue(PACED)) == 0, timeout_s=30, what="the queue emptied")
    # what was queued at the cancel is dropped unrun, less the few the worker took meanwhile
    wait_for(lambda: paced_totals(paced)["left"] - before["left"] >= queued - 5, timeout_s=30,
             what="the queued requests counted as dropped", detail=lambda: f"{queued} queued, {paced_totals(paced)}")
