"""Async and bulk jobs on a live stack: results equal to the synchronous answers, in input order;
paging; JSON Lines results; Prefer: respond-async; Idempotency-Key; cancel mid-job; interactive
requests during a job."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import redis
from werkzeug.datastructures import Headers

from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests.support import http, wait_for

TEXT = "text-embedding"
BATCH = 32


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path_factory.mktemp("jobs"),
               worker_env={"FUNNEL_BATCH_SIZE": str(BATCH)}) as running:
        yield running


def corpus(n: int, tag: str) -> list[str]:
    return [f"{tag} passage {i}: {'a quick brown fox ' * (i % 7)}jumps over {i % 13} dogs" for i in range(n)]


def submit(stack, texts, headers=None):
    return http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body={"texts": texts}, headers=headers)


def status(stack, job_id, **query):
    suffix = "&".join(f"{k}={v}" for k, v in query.items())
    return http("GET", f"{stack.url}/v1/jobs/{job_id}?{suffix}")


def finished(stack, job_id, timeout_s=120):
    return wait_for(lambda: (lambda b: b if b["state"] in ("done", "failed", "cancelled") else None)(
        status(stack, job_id, limit=0)[1]), timeout_s=timeout_s, interval_s=0.1, what="job finished")


def all_results(stack, job_id, page=1000):
    results, offset = [], 0
    while offset is not None:
        code, body, _ = status(stack, job_id, offset=offset, limit=page)
        assert code == 200
        results += body["results"]
        offset = body["next_offset"]
    return results


def test_bulk_job_equals_the_synchronous_answers_in_order(stack):
    texts = corpus(1200, "bulk")  # more than one page of results (1,000)
    code, body, headers = submit(stack, texts)
    assert code == 202, body
    assert headers["Location"] == f"/v1/jobs/{body['id']}"
    assert body["state"] in ("queued", "running") and body["progress"]["total"] == len(texts)
    done = finished(stack, body["id"], timeout_s=240)
    assert done["state"] == "done" and done["progress"] == {"done": 1200, "total": 1200, "failed": 0}
    results = all_results(stack, body["id"])
    assert len(results) == len(texts)
    for i in [0, 1, 2, 999, 1000, 1199]:  # spot checks against /predict, one text at a time
        sync = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": texts[i]})[1]
        assert np.allclose(results[i]["embedding"], sync["embedding"], atol=1e-5), i
    # Every result in input order: compare all against one synchronous batch-of-64 pass per chunk.
    for start in range(0, len(texts), 64):
        sync = http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                    json_body={"texts": texts[start:start + 64]})[1]["results"]
        got = np.array([r["embedding"] for r in results[start:start + 64]])
        assert np.allclose(got, np.array([s["embedding"] for s in sync]), atol=1e-5), start
    client = redis.Redis.from_url(stack.redis_url)
    assert int(client.hget(Keys().job(body['id']), "duplicates")) == 0


def json_lines(stack, job_id, offset=0):
    """GET /v1/jobs/<id>/results: (status, parsed lines, headers)."""
    try:
        with urllib.request.urlopen(f"{stack.url}/v1/jobs/{job_id}/results?offset={offset}", timeout=60) as response:
            return response.status, [json.loads(line) for line in response], Headers(response.headers.items())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), Headers(err.headers.items())


def test_json_lines_results_equal_the_paged_results(stack):
    from funnel_client import Client

    texts = corpus(1100, "lines")  # more than one HMGET chunk (1,000) of the stream
    job_id = submit(stack, texts)[1]["id"]
    code, early, headers = json_lines(stack, job_id)  # while it runs: a line per item, null if not answered
    assert code == 200 and len(early) == len(texts) and headers["Content-Type"] == "application/x-ndjson"
    assert headers["Funnel-Job-State"] in ("queued", "running") and None in early
    assert all(r is None or len(r["embedding"]) == 384 for r in early)
    finished(stack, job_id, timeout_s=240)
    paged = all_results(stack, job_id)
    code, streamed, headers = json_lines(stack, job_id)
    assert code == 200 and headers["Funnel-Job-State"] == "done"
    assert streamed == paged and None not in streamed
    assert json_lines(stack, job_id, offset=1000)[1] == paged[1000:]
    assert json_lines(stack, job_id, offset=1100)[1] == []
    with Client(stack.url) as client:
        assert list(client.stream_results(job_id, offset=999)) == paged[999:]
        assert list(client.results(job_id)) == paged
    assert json_lines(stack, job_id, offset=-1)[0] == 400
    assert json_lines(stack, "f" * 32)[0] == 404 and json_lines(stack, "0" * 12 + "f" * 20)[0] == 410


def test_paging_and_bad_queries(stack):
    texts = corpus(25, "paging")
    job_id = submit(stack, texts)[1]["id"]
    finished(stack, job_id)
    code, body, _ = status(stack, job_id, offset=20, limit=10)
    assert code == 200 and len(body["results"]) == 5 and body["next_offset"] is None
    code, body, _ = status(stack, job_id, offset=0, limit=10)
    assert len(body["results"]) == 10 and body["next_offset"] == 10
    assert status(stack, job_id, limit=5000)[0] == 400
    assert status(stack, job_id, offset=-1)[0] == 400
    assert status(stack, "not-a-job")[0] == 404
    assert status(stack, "0" * 12 + "f" * 20)[0] == 410  # a well-formed id from long ago: expired


def test_prefer_respond_async_on_predict(stack):
    code, body, headers = http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                               json_body={"text": "A man is eating food."}, headers={"Prefer": "respond-async"})
    assert code == 202 and headers["Preference-Applied"] == "respond-async"
    assert finished(stack, body["id"])["state"] == "done"
    result = status(stack, body["id"])[1]["results"][0]
    sync = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "A man is eating food."})[1]
    assert np.allclose(result["embedding"], sync["embedding"], atol=1e-5)


def test_bad_item_fails_the_submit_by_index(stack):
    code, body, _ = submit(stack, ["fine", "   ", "fine too"])
    assert code == 400 and body["error"]["message"].startswith("item 1:")
    assert submit(stack, [])[0] == 400
    assert http("POST", f"{stack.url}/v1/models/nope/jobs", json_body={"texts": ["x"]})[0] == 404


def test_idempotent_resubmit(stack):
    texts = corpus(40, "idem")
    first = submit(stack, texts, {"Idempotency-Key": "order-17"})
    again = submit(stack, texts, {"Idempotency-Key": "order-17"})
    assert first[0] == again[0] == 202
    assert first[1]["id"] == again[1]["id"] and again[2].get("Idempotent-Replayed") == "true"
    other = submit(stack, texts, {"Idempotency-Key": "order-18"})
    assert other[1]["id"] != first[1]["id"]
    assert submit(stack, texts[:3], {"Idempotency-Key": "order-17"})[0] == 422  # same key, other body
    finished(stack, first[1]["id"])
    client = redis.Redis.from_url(stack.redis_url)
    assert int(client.hget(Keys().job(first[1]['id']), "total")) == 40  # queued once


def test_cancel_mid_job_runs_no_untaken_item(stack):
    texts = corpus(1500, "cancel")
    job_id = submit(stack, texts)[1]["id"]
    wait_for(lambda: status(stack, job_id, limit=0)[1]["progress"]["done"] >= 50, timeout_s=60,
             interval_s=0.02, what="some progress")
    code, body, _ = http("DELETE", f"{stack.url}/v1/jobs/{job_id}")
    assert code == 200 and body["state"] == "cancelled"
    at_cancel = body["progress"]["done"]
    client = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: client.llen(f"funnel:bulk:{{{TEXT}}}:1") == 0, timeout_s=60, what="cancelled items drained")
    # Nothing taken after the cancel runs: at most the batch in hand (and one being filled) ends.
    wait_for(lambda: not any(client.llen(k) for k in client.keys("funnel:inflight:*")), what="in-flight drained")
    final = status(stack, job_id, limit=0)[1]
    assert final["state"] == "cancelled"
    assert at_cancel <= final["progress"]["done"] <= at_cancel + 2 * BATCH < len(texts)
    # The service still answers, and a cancel of an unknown job is a 404.
    assert http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "still here"})[0] == 200
    assert http("DELETE", f"{stack.url}/v1/jobs/{'f' * 32}")[0] == 404


def test_interactive_requests_are_served_during_a_bulk_job(stack):
    texts = corpus(2000, "fair")
    job_id = submit(stack, texts)[1]["id"]
    wait_for(lambda: status(stack, job_id, limit=0)[1]["progress"]["done"] > 0, what="bulk running")
    for i in range(20):  # each answered while the job still has most of its items queued
        code, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": f"now {i}"})
        assert code == 200
    progress = status(stack, job_id, limit=0)[1]["progress"]
    assert progress["done"] < progress["total"], "the interactive requests waited for the whole job"
    http("DELETE", f"{stack.url}/v1/jobs/{job_id}")


def test_python_client_submit_wait_results_cancel(stack):
    from funnel_client import Client

    texts = corpus(150, "client")
    with Client(stack.url) as client:
        job = client.submit_job(TEXT, texts)
        seen = []
        final = client.wait(job["id"], timeout=120, poll_s=0.1, progress=lambda s: seen.append(s["progress"]))
        assert final["state"] == "done" and seen[-1]["done"] == len(texts)
        results = list(client.results(job["id"], page=64))
        assert len(results) == len(texts) and all("embedding" in r for r in results)
        sync = client.predict(TEXT, texts=texts[100:110])["results"]
        assert np.allclose([r["embedding"] for r in results[100:110]], [s["embedding"] for s in sync], atol=1e-5)
        again = client.submit_job(TEXT, texts, idempotency_key="client-key")
        assert client.submit_job(TEXT, texts, idempotency_key="client-key")["id"] == again["id"]
        assert client.cancel(again["id"])["state"] in ("cancelled", "done")
        assert client.job_status(again["id"])["state"] in ("cancelled", "done")


def test_without_api_keys_anyone_reads_and_cancels_any_job(stack):
    """No FUNNEL_API_KEYS: nobody owns a job (tests/integration/test_job_ownership.py has the keyed
    server); whatever Authorization a request carries is ignored, Idempotency-Keys are shared."""
    texts = corpus(30, "open")
    code, job, _ = submit(stack, texts, {"Authorization": "Bearer alice", "Idempotency-Key": "open-1"})
    assert code == 202
    again = submit(stack, texts, {"Authorization": "Bearer bob", "Idempotency-Key": "open-1"})
    assert again[1]["id"] == job["id"] and again[2]["Idempotent-Replayed"] == "true"
    assert submit(stack, texts[:2], {"Idempotency-Key": "open-1"})[0] == 422
    assert finished(stack, job["id"])["state"] == "done"
    for who in ({}, {"Authorization": "Bearer carol"}):
        assert http("GET", f"{stack.url}/v1/jobs/{job['id']}?limit=1", headers=who)[0] == 200
        assert http("DELETE", f"{stack.url}/v1/jobs/{job['id']}", headers=who)[0] == 200
    client = redis.Redis.from_url(stack.redis_url)
    assert client.hmget(Keys().job(job['id']), "owner", "owner_label") == [b"", b""]
