"""The whole stack on a Redis Cluster (three primaries on loopback, a redis+cluster:// URL): both
models answered as on a single Redis, each model's keys on its own node, redis-cli -c inspection,
bulk jobs end to end (submit, status, results, Idempotency-Key, cancel, webhooks, the dashboard),
and the core faults: a worker killed mid-batch, a full queue, shedding."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest

from funnel.common import tasks
from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import connect, scan_keys
from funnel.common.store import load_spec
from funnel.scripts.redis_local import redis_cli_binary
from funnel.scripts.stack import Stack
from funnel.web.queueing.shedding import REFRESH_S
from funnel_client import verify_webhook
from tests.support import (
    FAST_HEARTBEAT,
    TEXT,
    Outcome,
    WebhookReceiver,
    assert_each_answered_once,
    freeze_holding_jobs,
    http,
    load_running,
    send_texts,
    stray_replies,
    texts,
    wait_for,
)

IMAGE = "image-classifier"
KEYS = Keys()
SECRET = "cluster-webhook-secret"
WEBHOOKS = {"FUNNEL_WEBHOOK_SECRET": SECRET, "FUNNEL_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"}


@pytest.fixture(scope="module")
def stack(redis_cluster, model_store, tmp_path_factory):
    with Stack(model_store=model_store, redis_url=redis_cluster.url, workers=[],
               log_dir=tmp_path_factory.mktemp("cluster-stack"), web_env={"FUNNEL_MAX_QUEUE": "64", **WEBHOOKS},
               worker_env={**FAST_HEARTBEAT, **WEBHOOKS, "FUNNEL_LINGER_MS": "20",
                           "FUNNEL_BATCH_SIZE": "8"}) as running:
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
        return task.postprocess(backend.run(task.collate([task.preprocess(item)]))[0])
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


def submit_job(stack, texts, webhook=None, headers=None):
    body = {"texts": texts, **({"webhook": webhook} if webhook else {})}
    return http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body=body, headers=headers)


def job_status(stack, job_id):
    return http("GET", f"{stack.url}/v1/jobs/{job_id}?limit=0")[1]


def settled(stack, job_id, timeout_s=120):
    """The job's status once it is final and its webhook delivered or given up."""
    return wait_for(lambda: (lambda s: s if s["state"] in ("done", "failed", "cancelled")
                             and s["webhook"]["state"] in ("delivered", "failed") else None)(job_status(stack, job_id)),
                    timeout_s=timeout_s, interval_s=0.1, what="job final and its webhook settled")


def test_a_bulk_job_end_to_end_on_a_cluster(stack, client, reference):
    """Submit with an Idempotency-Key and a webhook, replay it, read status and results, and find its
    keys in its own slot: the record and results hash (the store script's) together, the
    Idempotency-Key in the model's (the submit's MULTI, with the bulk queue)."""
    texts = [f"cluster bulk {i}: {'the quick brown fox ' * (i % 5)}" for i in range(240)]
    with WebhookReceiver() as receiver:
        code, body, headers = submit_job(stack, texts, receiver.url, headers={"Idempotency-Key": "cluster-1"})
        assert code == 202, body
        job_id = body["id"]
        assert headers["Location"] == f"/v1/jobs/{job_id}" and body["progress"]["total"] == len(texts)
        code, again, headers = submit_job(stack, texts, receiver.url, headers={"Idempotency-Key": "cluster-1"})
        assert code == 202 and again["id"] == job_id and headers.get("Idempotent-Replayed") == "true"
        code, other, _ = submit_job(stack, texts[:3], receiver.url, headers={"Idempotency-Key": "cluster-1"})
        assert code == 422 and other["error"]["code"] == "idempotency_key_reused"
        final = settled(stack, job_id)
        (hook_headers, payload), = receiver.wait_for(1)
    assert final["state"] == "done" and final["progress"] == {"done": len(texts), "total": len(texts), "failed": 0}
    assert final["webhook"]["state"] == "delivered" and final["webhook"]["attempts"] == 1
    delivered = verify_webhook(SECRET, hook_headers, payload)
    assert delivered["id"] == job_id and delivered["state"] == "done"
    code, page, _ = http("GET", f"{stack.url}/v1/jobs/{job_id}?offset=230&limit=50")
    assert code == 200 and len(page["results"]) == 10 and page["next_offset"] is None
    lines = http_lines(f"{stack.url}/v1/jobs/{job_id}/results")
    assert len(lines) == len(texts) and all(line and "embedding" in line for line in lines)
    for i in (0, 1, 117, 239):
        assert np.allclose(lines[i]["embedding"], reference(TEXT, texts[i])["embedding"], atol=1e-4), i
    assert np.allclose(page["results"][0]["embedding"], lines[230]["embedding"])
    record = client.hgetall(KEYS.job(job_id))
    assert record[b"duplicates"] == b"0" and record[b"done"] == str(len(texts)).encode()
    assert client.hlen(KEYS.job_results(job_id)) == len(texts)
    assert client.cluster_keyslot(KEYS.job(job_id)) == client.cluster_keyslot(KEYS.job_results(job_id))
    assert client.ttl(KEYS.job(job_id)) > 0 and client.ttl(KEYS.job_results(job_id)) > 0
    assert client.zscore(KEYS.webhooks_due(), job_id) is None  # settled: out of the due set
    idempotency = list(scan_keys(client, f"funnel:idempotency:{{{TEXT}}}:*"))  # on every primary
    assert len(idempotency) == 1 and client.get(idempotency[0]) == job_id.encode()
    assert client.cluster_keyslot(idempotency[0]) == client.cluster_keyslot(KEYS.bulk(TEXT))
    assert http("GET", f"{stack.url}/v1/jobs/{'f' * 32}")[0] == 404


def test_a_bulk_job_cancelled_on_a_cluster_stops_and_tells_its_webhook(stack, client):
    texts = [f"cluster cancel {i}: {'lorem ipsum dolor ' * (i % 9)}" for i in range(2500)]
    with WebhookReceiver() as receiver:
        code, body, _ = submit_job(stack, texts, receiver.url)
        assert code == 202, body
        job_id = body["id"]
        wait_for(lambda: job_status(stack, job_id)["progress"]["done"] >= 16, timeout_s=60, interval_s=0.05,
                 what="some progress")
        shown = http("GET", f"{stack.url}/dashboard/state")[1]["jobs"]  # the dashboard's unfinished jobs
        assert job_id in [job["id"] for job in shown]
        code, body, _ = http("DELETE", f"{stack.url}/v1/jobs/{job_id}")
        assert code == 200 and body["state"] == "cancelled", body
        at_cancel = body["progress"]["done"]
        final = settled(stack, job_id)
        (hook_headers, payload), = receiver.wait_for(1)
    assert verify_webhook(SECRET, hook_headers, payload)["state"] == "cancelled"
    assert final["state"] == "cancelled" and final["webhook"]["state"] == "delivered"
    wait_for(lambda: client.llen(KEYS.bulk(TEXT)) == 0, timeout_s=60, what="its items dropped unrun")
    done = job_status(stack, job_id)["progress"]["done"]
    assert at_cancel <= done < len(texts) // 2  # only the batches in hand at the cancel ended
    shown = http("GET", f"{stack.url}/dashboard/state")[1]["jobs"]
    assert job_id not in [job["id"] for job in shown]
    assert http("DELETE", f"{stack.url}/v1/jobs/{'f' * 32}")[0] == 404


def test_an_async_predict_is_a_job_on_a_cluster(stack):
    code, body, headers = predict(stack, TEXT, json_body={"text": "later, please"}, headers={"Prefer": "respond-async"})
    assert code == 202 and headers.get("Preference-Applied") == "respond-async", body
    done = wait_for(lambda: (lambda s: s if s["state"] == "done" else None)(job_status(stack, body["id"])),
                    timeout_s=60, interval_s=0.1, what="async predict done")
    assert done["progress"] == {"done": 1, "total": 1, "failed": 0}


def http_lines(url: str) -> list:
    """A JSON Lines answer, one value a line."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as answer:
        return [orjson.loads(line) for line in answer.read().splitlines() if line]


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


def test_a_bulk_item_past_its_attempts_is_answered_into_its_job_on_a_cluster(client):
    """Recovery stores the too_many_attempts error in the job's slot, apart from its requeue MULTI."""
    from funnel.common.contracts import wire
    from funnel.worker.recovery import Recovery
    from tests.unit.test_jobs import make_job

    keys = Keys(cluster=True)
    job_id = make_job(client, keys, 2)
    held = [wire.Job(id=f"{job_id}-{i}", model="m", items=[{"x": np.zeros(1, np.int32)}],
                     reply_to=keys.job_results(job_id), deadline=wire.now_ms() + 60_000, attempt=attempt)
            for i, attempt in ((0, 2), (1, 0))]
    client.hset(keys.workers(), "dead-bulk", "m")
    for job in held:
        client.lpush(keys.inflight("m", "dead-bulk"), wire.encode_job(job))
    assert Recovery(client, keys, "peer", max_attempts=3, reply_ttl_s=60).sweep() == 1
    stored = client.hgetall(keys.job_results(job_id))
    assert list(stored) == [b"0"] and wire.decode_reply(stored[b"0"]).error["code"] == "too_many_attempts"
    assert int(client.hget(keys.job(job_id), "done")) == 1
    assert [wire.decode_job(r).id for r in client.lrange(keys.bulk("m"), 0, -1)] == [f"{job_id}-1"]
    assert client.llen(keys.dead("m")) == 1
