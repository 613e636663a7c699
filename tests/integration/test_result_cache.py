"""The result cache (common/result_cache.py, web/queueing/cache_plan.py) against a real redis-server, a
web tier and text workers: a hit answered with no worker, a request of known and new items, 64
concurrent requests for one new text computed once, a corrupt entry, a new version, and tenants."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests.support import FAST_HEARTBEAT, cached_store, http, metric, wait_for

MODEL = "text-embedding"
KEYS = "alpha=alpha-key,beta=beta-key,solo=solo-key"
ALPHA = {"Authorization": "Bearer alpha-key"}
BETA = {"Authorization": "Bearer beta-key"}
SOLO = {"Authorization": "Bearer solo-key"}  # one request under way at a time, one a second


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    store = cached_store(model_store, tmp_path_factory.mktemp("cache"), MODEL, versions=(1, 2))
    with Stack(model_store=store, models=[MODEL], workers=[f"{MODEL}:1", f"{MODEL}:2"],
               log_dir=tmp_path_factory.mktemp("cache-logs"),
               worker_env={"FUNNEL_INTRA_OP_THREADS": "1", **FAST_HEARTBEAT},
               web_env={"FUNNEL_API_KEYS": KEYS, "FUNNEL_REQUEST_TIMEOUT_S": "30",
                        "FUNNEL_KEY_LIMITS": json.dumps({"solo": {"concurrency": 1, "rate": 1, "burst": 2}})}
               ) as running:
        yield running


def predict(stack, body: dict, headers: dict = ALPHA, version: int | None = None):
    path = f"/v1/models/{MODEL}" + (f"/versions/{version}" if version else "") + "/predict"
    status, answer, got = http("POST", stack.url + path, json_body=body, headers=headers)
    assert status == 200, answer
    return answer, got


def items_computed(stack) -> float:
    _, answer, _ = http("GET", stack.url + "/metrics", headers=ALPHA)
    return metric(answer["_text"], "funnel_worker_items_total", model=MODEL)


def settled(stack) -> float:
    """The workers' item count once it stops moving (their registry is written a beat late)."""
    seen = [items_computed(stack)]

    def still():
        seen.append(items_computed(stack))
        return len(seen) > 2 and seen[-1] == seen[-2]
    wait_for(still, timeout_s=10, interval_s=1.5, what="the workers' counters to settle")
    return seen[-1]


def test_a_known_text_is_answered_from_the_cache_without_a_worker(stack):
    first, headers = predict(stack, {"text": "the cache's first text"})
    assert headers["X-Cache"] == "MISS" and first["meta"]["cache"] == "miss"
    before = settled(stack)
    again, headers = predict(stack, {"text": "the cache's first text"})
    assert headers["X-Cache"] == "HIT" and again["meta"]["cache"] == "hit"
    assert again["meta"]["batch_size"] == 0
    assert np.allclose(again["embedding"], first["embedding"])
    assert settled(stack) == before, "a hit ran on a worker"
    mixed, headers = predict(stack, {"texts": ["a new text", "the cache's first text", "a new text"]})
    assert headers["X-Cache"] == "PARTIAL"
    assert [m["cache"] for m in mixed["meta"]] == ["miss", "hit", "coalesced"]
    assert np.allclose(mixed["results"][1]["embedding"], first["embedding"])
    assert np.allclose(mixed["results"][0]["embedding"], mixed["results"][2]["embedding"])
    assert settled(stack) == before + 1, "the repeated new text ran once"


def cache_counts(stack) -> dict[str, float]:
    _, text, _ = http("GET", stack.url + "/metrics", headers=ALPHA)
    return {outcome: metric(text["_text"], "funnel_cache_items_total", absent=0.0, model=MODEL, outcome=outcome)
            for outcome in ("hit", "miss", "coalesced")}  # 0 before any item was: the test runs alone too


def test_64_concurrent_requests_for_one_new_text_compute_it_once(stack):
    predict(stack, {"text": "warm the counters"})
    before, counted = settled(stack), cache_counts(stack)
    with ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda _: predict(stack, {"text": "sixty-four at once"}), range(64)))
    vectors = np.array([answer["embedding"] for answer, _ in answers])
    assert np.allclose(vectors, vectors[0], atol=1e-6)
    kinds = [answer["meta"]["cache"] for answer, _ in answers]
    assert kinds.count("miss") == 1, kinds
    assert settled(stack) == before + 1, "the model computed the text more than once"
    after = cache_counts(stack)
    assert {k: after[k] - counted[k] for k in after} == {k: kinds.count(k) for k in after}


def entry_keys(stack) -> list[bytes]:
    client = redis.Redis.from_url(stack.redis_url)
    return list(client.scan_iter(Keys().pattern("cache")))


def test_a_corrupt_entry_is_a_miss_and_is_written_again(stack):
    predict(stack, {"text": "soon corrupt"})
    client = redis.Redis.from_url(stack.redis_url)
    corrupted = 0
    for key in entry_keys(stack):
        if client.get(key) is not None:
            client.set(key, b"\x81\xa1v\x01 not a reply", keepttl=True)
            corrupted += 1
    assert corrupted
    answer, headers = predict(stack, {"text": "soon corrupt"})
    assert headers["X-Cache"] == "MISS" and len(answer["embedding"]) == 384
    _, headers = predict(stack, {"text": "soon corrupt"})
    assert headers["X-Cache"] == "HIT"


def test_a_new_version_starts_cold(stack):
    predict(stack, {"text": "versioned text"}, version=1)
    _, headers = predict(stack, {"text": "versioned text"}, version=1)
    assert headers["X-Cache"] == "HIT"
    answer, headers = predict(stack, {"text": "versioned text"}, version=2)
    assert headers["X-Cache"] == "MISS" and answer["meta"]["model_version"] == 2


def test_one_key_never_hits_another_keys_entry(stack):
    predict(stack, {"text": "alpha's secret"}, ALPHA)
    _, headers = predict(stack, {"text": "alpha's secret"}, ALPHA)
    assert headers["X-Cache"] == "HIT"
    _, headers = predict(stack, {"text": "alpha's secret"}, BETA)
    assert headers["X-Cache"] == "MISS", "beta learnt that alpha had sent the text"


def test_v2_parameters_say_whether_it_was_a_hit(stack):
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["v2 text"]}]}
    path = stack.url + f"/v2/models/{MODEL}/versions/1/infer"
    statuses = [http("POST", path, json_body=body, headers=ALPHA) for _ in range(2)]
    assert [s[0] for s in statuses] == [200, 200], statuses
    assert [s[1]["parameters"]["cache"] for s in statuses] == ["miss", "hit"]


def submit_job(stack, texts: list[str], headers: dict = ALPHA) -> dict:
    status, answer, _ = http("POST", f"{stack.url}/v1/models/{MODEL}/jobs", json_body={"texts": texts},
                             headers=headers)
    assert status == 202, answer
    return answer


def job_results(stack, job: dict, headers: dict = ALPHA) -> list[dict]:
    def done():
        _, body, _ = http("GET", f"{stack.url}/v1/jobs/{job['id']}?limit=100", headers=headers)
        return body if body["state"] in ("done", "failed") else None
    finished = wait_for(done, timeout_s=60, interval_s=0.1, what="the job to finish")
    assert finished["state"] == "done", finished
    return finished["results"]


def test_bulk_jobs_read_the_cache_and_fill_it_per_key(stack):
    known, _ = predict(stack, {"text": "bulk: known before"})
    before, counted = settled(stack), cache_counts(stack)
    texts = ["bulk: known before", "bulk: new one", "bulk: new two"]
    results = job_results(stack, submit_job(stack, texts))
    assert np.allclose(results[0]["embedding"], known["embedding"])
    assert settled(stack) == before + 2, "the known item ran again"
    after = cache_counts(stack)
    assert {k: after[k] - counted[k] for k in after} == {"hit": 1, "miss": 2, "coalesced": 0}
    # The job filled the entries of what it computed: a request, and a job, of them are hits.
    answer, headers = predict(stack, {"text": "bulk: new two"})
    assert headers["X-Cache"] == "HIT" and np.allclose(answer["embedding"], results[2]["embedding"])
    again = submit_job(stack, texts)
    assert again["state"] == "done" and again["progress"] == {"done": 3, "total": 3, "failed": 0}, again
    assert again["finished_ms"] is not None
    assert [r["embedding"] for r in job_results(stack, again)] == [r["embedding"] for r in results]
    assert settled(stack) == before + 2, "a job of known items ran on a worker"
    # Another key's job is computed (and its entries are its own).
    results = job_results(stack, submit_job(stack, texts[:1], BETA), BETA)
    assert settled(stack) == before + 3, "beta's job hit alpha's entry"
    assert np.allclose(results[0]["embedding"], known["embedding"], atol=1e-5)


def test_asking_again_for_an_unreadable_entry_charges_the_key_nothing_more(stack):
    """A request computes again an item whose entry is unreadable (a second push of its own): its
    key, at one request under way and two at once, is neither past its cap nor its rate for it."""
    client = redis.Redis.from_url(stack.redis_url)
    before = set(entry_keys(stack))
    predict(stack, {"text": "solo's text"}, SOLO)
    for key in set(entry_keys(stack)) - before:
        if client.get(key) is not None:
            client.set(key, b"not an entry", keepttl=True)
    answer, headers = predict(stack, {"text": "solo's text"}, SOLO)
    assert headers["X-Cache"] == "MISS" and len(answer["embedding"]) == 384


def test_with_no_live_worker_known_items_are_answered_and_nothing_is_queued(model_store, tmp_path):
    """Every worker gone: a request whose items are all known is answered from the cache; one with
    any item not known is 503 no_worker, at once, and leaves nothing queued or marked under way."""
    store = cached_store(model_store, tmp_path, MODEL)
    with Stack(model_store=store, models=[MODEL], workers=[MODEL], log_dir=tmp_path / "logs",
               worker_env={"FUNNEL_INTRA_OP_THREADS": "1", **FAST_HEARTBEAT}) as running:
        url = f"{running.url}/v1/models/{MODEL}/predict"
        status, first, _ = http("POST", url, json_body={"texts": ["known one", "known two"]})
        assert status == 200
        worker = running.workers[0]
        worker.terminate()
        worker.wait(timeout=30)
        wait_for(lambda: http("POST", url, json_body={"text": "nobody computes this"},
                              headers={"X-Request-Timeout": "1"})[0] == 503,
                 timeout_s=30, what="the web tier to see no live worker")
        client = redis.Redis.from_url(running.redis_url)

        def queued_and_marked():  # a probe sent before the web tier saw the worker go may be left
            return (sum(client.llen(key) for key in client.scan_iter(Keys().pattern("queue"))),
                    sorted(client.scan_iter(Keys().pattern("cache-pending"))))
        before = queued_and_marked()
        status, answer, headers = http("POST", url, json_body={"texts": ["known two", "known one"]})
        assert status == 200 and headers["X-Cache"] == "HIT"
        assert np.allclose(answer["results"][0]["embedding"], first["results"][1]["embedding"])
        for texts in (["a new text"], ["known one", "a new text"]):
            status, answer, _ = http("POST", url, json_body={"texts": texts})
            assert status == 503 and answer["error"]["code"] == "no_worker", answer
        assert queued_and_marked() == before, "a job was queued, or an item marked under way, for no worker"
