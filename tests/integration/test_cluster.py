"""The whole stack on a Redis Cluster (three primaries on loopback, a redis+cluster:// URL): both
models answered as on a single Redis, each model's keys on its own node, redis-cli -c inspection,
and the core faults: a worker killed mid-batch, a full queue, shedding."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from funnel.common import registry, tasks
from funnel.common.connection import connect
from funnel.common.keys import Keys
from funnel.common.store import load_spec
from funnel.scripts.redis_local import redis_cli_binary
from funnel.scripts.stack import Stack
from funnel.web.queueing.shedding import REFRESH_S
from tests.conftest import http
from tests.faults.conftest import (
    FAST_HEARTBEAT,
    TEXT,
    Outcome,
    assert_each_answered_once,
    freeze_holding_jobs,
    load_running,
    send_texts,
    stray_replies,
    texts,
    wait_for,
)

IMAGE = "image-classifier"
KEYS = Keys()


@pytest.fixture(scope="module")
def stack(redis_cluster, model_store, tmp_path_factory):
    with Stack(model_store=model_store, redis_url=redis_cluster.url, workers=[],
               log_dir=tmp_path_factory.mktemp("cluster-stack"), web_env={"FUNNEL_MAX_QUEUE": "64"},
               worker_env={**FAST_HEARTBEAT, "FUNNEL_LINGER_MS": "20", "FUNNEL_BATCH_SIZE": "8"}) as running:
        running.text_worker = running.start_worker(TEXT, FUNNEL_WORKER_ID="text-1")
        running.image_worker = running.start_worker(IMAGE, FUNNEL_WORKER_ID="image-1")
        running.wait_ready(90, expected={TEXT: 1, IMAGE: 1})
        yield running


@pytest.fixture(scope="module")
def client(redis_cluster):
    return connect(redis_cluster.url, socket_timeout=5)


@pytest.fixture(scope="module")
def reference(model_store):
    """What a single process computes for an input: the answers a single-Redis stack gives."""
    from funnel.worker.backend import load

    loaded = {}

    def run(model: str, item):
        if model not in loaded:
            spec = load_spec(model_store, model)
            loaded[model] = tasks.load(spec), load(spec, "onnx", "cpu")
        task, backend = loaded[model]
        return task.postprocess({k: v[0] for k, v in backend.run(task.collate([task.preprocess(item)])).items()})
    return run


def embeddings(reference, batch: list[str]) -> dict:
    return {text: np.array(reference(TEXT, text)["embedding"]) for text in batch}


def predict(stack, model, **kwargs):
    return http("POST", f"{stack.url}/v1/models/{model}/predict", **kwargs)


def test_both_models_answer_as_on_a_single_redis(stack, reference, cat_jpeg):
    status, body, _ = predict(stack, TEXT, json_body={"text": "A man is eating food."})
    assert status == 200, body
    assert np.allclose(body["embedding"], reference(TEXT, "A man is eating food.")["embedding"], atol=1e-4)
    status, body, _ = predict(stack, IMAGE, body=cat_jpeg, headers={"Content-Type": "image/jpeg"})
    assert status == 200, body
    expected = reference(IMAGE, cat_jpeg)["predictions"]
    assert [p["index"] for p in body["predictions"]] == [p["index"] for p in expected]
    assert body["predictions"][0]["probability"] == pytest.approx(expected[0]["probability"], abs=1e-4)


def test_many_concurrent_requests_each_get_their_own_answer(stack, reference):
    batch = texts(60, "cluster")
    outcome = Outcome()
    send_texts(stack, batch, embeddings(reference, batch), outcome, clients=12)
    assert outcome.statuses == {200: 60} and outcome.wrong == 0


def test_each_models_keys_share_a_slot_and_the_models_use_different_nodes(stack, redis_cluster, client):
    text_node, image_node = redis_cluster.node_of(KEYS.queue(TEXT)), redis_cluster.node_of(KEYS.queue(IMAGE))
    assert text_node is not image_node
    for model, worker_id in ((TEXT, "text-1"), (IMAGE, "image-1")):
        slot = client.cluster_keyslot(KEYS.queue(model))
        assert client.cluster_keyslot(KEYS.worker(model, worker_id)) == slot
        assert client.cluster_keyslot(KEYS.inflight(model, worker_id)) == slot
    assert client.cluster_keyslot(KEYS.reply(TEXT, "web-1")) == client.cluster_keyslot(KEYS.queue(TEXT))
    workers = {w["id"]: w["model"] for w in registry.live_workers(client, KEYS)}  # hashes on two nodes
    assert workers == {"text-1": TEXT, "image-1": IMAGE}


def test_redis_cli_c_and_funnel_inspect_read_the_cluster(stack, redis_cluster):
    other = next(n for n in redis_cluster.nodes if n is not redis_cluster.node_of(KEYS.queue(IMAGE)))

    def cli(*args):  # asked of a node that does not own the key: -c follows the MOVED redirect
        return subprocess.run([redis_cli_binary(), "-c", "-p", str(other.port), *args],
                              capture_output=True, text=True, check=True, timeout=10).stdout

    assert cli("LLEN", KEYS.queue(IMAGE)).strip() == "0"
    fields = cli("HGETALL", KEYS.worker(IMAGE, "image-1")).split("\n")
    assert fields[fields.index("model") + 1] == IMAGE
    assert cli("HGET", "funnel:workers", "text-1").strip() == TEXT
    funnel = str(Path(sys.executable).parent / "funnel")
    out = subprocess.run([funnel, "inspect", "--redis-url", redis_cluster.url], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    assert "text-1: text-embedding" in out and "image-1: image-classifier" in out, out


def test_a_full_queue_is_503_at_once(stack, client, cat_jpeg):
    stack.image_worker.send_signal(signal.SIGSTOP)  # nobody takes while the queue is full
    try:
        client.lpush(KEYS.queue(IMAGE), *[b"placeholder"] * 64)
        # Redis itself hands the stopped worker's pending BLMOVE one of them: top the queue up again.
        client.lpush(KEYS.queue(IMAGE), *[b"placeholder"] * (64 - client.llen(KEYS.queue(IMAGE))))
        status, body, headers = predict(stack, IMAGE, body=cat_jpeg,
                                        headers={"Content-Type": "image/jpeg", "X-Request-Timeout": "5"})
        assert status == 503 and body["error"]["code"] == "overloaded" and "full" in body["error"]["message"]
        assert client.llen(KEYS.queue(IMAGE)) == 64  # never queued
    finally:
        client.delete(KEYS.queue(IMAGE))
        stack.image_worker.send_signal(signal.SIGCONT)


def test_a_wait_past_the_deadline_is_shed(stack, client):
    """The push script reads the queue and the workers' in-flight lists (one slot) to predict."""
    wait_for(lambda: registry.batch_cost(next(w for w in registry.live_workers(client, KEYS) if w["model"] == TEXT)),
             what="the text worker's batch cost in the registry")

    # A web process re-reads the registry at most every REFRESH_S (web/shedding.py): until its
    # view has the cost it cannot predict, queues the job and answers 504. Such a job may still be
    # answered after its 504 (an unclaimed reply): the crash test below counts strays from here on.
    def shed():
        answer = predict(stack, TEXT, json_body={"text": "too late"}, headers={"X-Request-Timeout": "0.001"})
        return answer if answer[0] == 503 else None

    status, body, headers = wait_for(shed, timeout_s=10 * REFRESH_S, interval_s=0.1,
                                     what="a web process whose view of the workers has their batch cost")
    assert body["error"]["code"] == "overloaded" and "deadline" in body["error"]["message"], body
    assert "Retry-After" in headers


def test_bulk_jobs_are_refused_on_a_cluster(stack):
    status, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body={"texts": ["a", "b"]})
    assert status == 501 and body["error"]["code"] == "unsupported_on_cluster"
    status, body, _ = predict(stack, TEXT, json_body={"text": "a"}, headers={"Prefer": "respond-async"})
    assert status == 501 and body["error"]["code"] == "unsupported_on_cluster"


def test_a_worker_killed_mid_batch_has_its_jobs_answered_once(stack, client, reference):
    victim = stack.start_worker(TEXT, FUNNEL_WORKER_ID="victim")
    stack.wait_ready(60, expected={TEXT: 2})
    batch = texts(120, "cluster-crash")
    stray_before = stray_replies(client, stack)
    progress = threading.Semaphore(0)
    with load_running(stack, batch, embeddings(reference, batch), 12, progress=progress) as outcome:
        for _ in range(20):
            progress.acquire(timeout=60)
        held = freeze_holding_jobs(client, victim, "victim")
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    stray = stray_replies(client, stack) - stray_before
    # Any live worker's sweep may recover it (the image worker's too): each counts in its own hash.
    def recovered_in_all() -> int:
        return int(sum(registry.counter(w, "recovered") for w in registry.live_workers(client, KEYS)))

    recovered = wait_for(recovered_in_all, what="count")
    assert_each_answered_once(outcome, len(batch), stray)
    assert recovered >= held > 0
    assert not client.exists(KEYS.inflight(TEXT, "victim"))
