"""Jobs belong to the API key that submitted them (docs/jobs.md, "Ownership"), on a live stack with
FUNNEL_API_KEYS=alice=keyA,bob=keyB,ops=keyC and FUNNEL_ADMIN_KEYS=ops: another key reading a job's
status or results, or cancelling it, is answered 404 unknown_job as for an id that never existed
(and the job runs on); Idempotency-Keys are each key's own; the admin key reads and cancels any job;
no key is a 401; the webhook, /metrics, `funnel inspect`, the Python client and `funnel-client` say
whose a job is without a key or its hash. Then the web app alone (no worker): a 404 for another
key's job costs the same Redis commands, and about the same time, as one for a missing id."""

from __future__ import annotations

import functools
import json
import statistics
import time
import urllib.error
import urllib.request

import pytest
import redis

from funnel.common.bulk import jobs
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from funnel.web import auth
from funnel_client import Client, NotFound, Unauthorized
from tests.integration.test_client import run_script
from tests.support import WebhookReceiver, flask_app, http, metric, wait_for

TEXT = "text-embedding"
API_KEYS = "alice=keyA,bob=keyB,ops=keyC"
ALICE, BOB, OPS = ({"Authorization": f"Bearer {key}"} for key in ("keyA", "keyB", "keyC"))
SECRET = "ownership-webhook-secret"
WEBHOOKS = {"FUNNEL_WEBHOOK_SECRET": SECRET, "FUNNEL_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path_factory.mktemp("ownership"),
               web_env={"FUNNEL_API_KEYS": API_KEYS, "FUNNEL_ADMIN_KEYS": "ops", **WEBHOOKS},
               worker_env={"FUNNEL_BATCH_SIZE": "16", **WEBHOOKS}) as running:
        yield running


def corpus(n: int, tag: str) -> list[str]:
    return [f"{tag} passage {i}: {'over the lazy dog ' * (i % 5)}and back" for i in range(n)]


def submit(stack, texts, who, **headers):
    return http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body={"texts": texts}, headers={**who, **headers})


def status(stack, job_id, who, query="limit=0"):
    return http("GET", f"{stack.url}/v1/jobs/{job_id}?{query}", headers=who)


def results(stack, job_id, who):
    """GET /v1/jobs/<id>/results: (status, raw body, Content-Type)."""
    request = urllib.request.Request(f"{stack.url}/v1/jobs/{job_id}/results", headers=who)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers["Content-Type"]


def cancel(stack, job_id, who):
    return http("DELETE", f"{stack.url}/v1/jobs/{job_id}", headers=who)


def finished(stack, job_id, who, timeout_s=120):
    return wait_for(lambda: (lambda b: b if b["state"] in ("done", "failed", "cancelled") else None)(
        status(stack, job_id, who)[1]), timeout_s=timeout_s, interval_s=0.1, what="job finished")


def as_missing(body: dict, job_id: str, never: str) -> dict:
    """A 404's body for one id, written as for another: what may differ is the id it names."""
    return json.loads(json.dumps(body).replace(job_id, never))


def test_another_key_cannot_read_the_results_of_or_cancel_a_job(stack):
    code, job, _ = submit(stack, corpus(1200, "alice"), ALICE)
    assert code == 202, job
    job_id, never = job["id"], jobs.new_job_id()
    for query in ("limit=0", "offset=0&limit=100"):
        mine, theirs = status(stack, job_id, BOB, query), status(stack, never, BOB, query)
        assert mine[0] == theirs[0] == 404 and mine[1]["error"]["code"] == "unknown_job"
        assert as_missing(mine[1], job_id, never) == theirs[1]  # the same answer as an id that never was
        assert mine[2]["Content-Type"] == theirs[2]["Content-Type"]
    got, missing = results(stack, job_id, BOB), results(stack, never, BOB)
    assert got[0] == missing[0] == 404 and got[2] == missing[2] == "application/json"
    assert got[1].replace(job_id.encode(), never.encode()) == missing[1]
    mine, theirs = cancel(stack, job_id, BOB), cancel(stack, never, BOB)
    assert mine[0] == theirs[0] == 404 and as_missing(mine[1], job_id, never) == theirs[1]
    # Bob's cancel left it running: it ends done, every item answered, for alice to read.
    at_cancel = status(stack, job_id, ALICE)[1]
    assert at_cancel["state"] in ("queued", "running") and at_cancel["progress"]["done"] < 1200
    final = finished(stack, job_id, ALICE)
    assert final["state"] == "done" and final["progress"] == {"done": 1200, "total": 1200, "failed": 0}
    assert "owner" not in json.dumps(final)  # a status never shows its owner: only its owner sees it
    code, body, content_type = results(stack, job_id, ALICE)
    assert code == 200 and content_type == "application/x-ndjson" and len(body.splitlines()) == 1200
    assert status(stack, job_id, BOB)[0] == 404  # done, and still not bob's


def test_idempotency_keys_are_each_api_keys_own(stack):
    texts = corpus(20, "idem")
    first = submit(stack, texts, ALICE, **{"Idempotency-Key": "order-17"})
    assert first[0] == 202 and "Idempotent-Replayed" not in first[2]
    same_body = submit(stack, texts, BOB, **{"Idempotency-Key": "order-17"})  # a new job, not alice's
    assert same_body[0] == 202 and "Idempotent-Replayed" not in same_body[2]
    assert same_body[1]["id"] != first[1]["id"]
    other_body = submit(stack, texts[:3], OPS, **{"Idempotency-Key": "order-17"})  # 202, never a 422
    assert other_body[0] == 202 and other_body[1]["id"] not in (first[1]["id"], same_body[1]["id"])
    assert other_body[1]["progress"]["total"] == 3
    refused = submit(stack, texts[:3], ALICE, **{"Idempotency-Key": "order-17"})  # her own key: 422
    assert refused[0] == 422 and refused[1]["error"]["code"] == "idempotency_key_reused"
    again = submit(stack, texts, ALICE, **{"Idempotency-Key": "order-17"})
    assert again[0] == 202 and again[1]["id"] == first[1]["id"] and again[2]["Idempotent-Replayed"] == "true"
    again = submit(stack, texts, BOB, **{"Idempotency-Key": "order-17"})
    assert again[1]["id"] == same_body[1]["id"] and again[2]["Idempotent-Replayed"] == "true"
    client = redis.Redis.from_url(stack.redis_url)
    owners = {client.hget(Keys().job(body['id']), "owner_label") for _, body, _ in (first, same_body, other_body)}
    assert owners == {b"alice", b"bob", b"ops"}
    assert client.hget(Keys().job(first[1]['id']), "owner") == auth.owner_of("keyA").encode()
    assert not any(key in raw for raw in client.hgetall(Keys().job(first[1]['id'])).values()
                   for key in (b"keyA", b"keyB"))  # the hash is recorded, never the key


def test_an_admin_key_reads_and_cancels_any_job(stack):
    code, job, _ = submit(stack, corpus(1200, "admin"), ALICE)
    assert code == 202
    code, seen, _ = status(stack, job["id"], OPS, "offset=0&limit=5")
    assert code == 200 and seen["id"] == job["id"] and len(seen["results"]) == 5
    assert results(stack, job["id"], OPS)[0] == 200
    code, cancelled, _ = cancel(stack, job["id"], OPS)
    assert code == 200 and cancelled["state"] in ("cancelled", "done")
    assert status(stack, job["id"], ALICE)[1]["state"] == cancelled["state"]  # alice sees the admin's cancel


def test_no_key_or_a_wrong_one_is_a_401_on_every_jobs_route(stack):
    job_id = submit(stack, ["keyed"], ALICE)[1]["id"]
    for who in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Bearer alice=keyA"}):
        assert submit(stack, ["x"], who)[0] == 401
        assert status(stack, job_id, who)[0] == 401 and status(stack, jobs.new_job_id(), who)[0] == 401
        assert results(stack, job_id, who)[0] == 401 and cancel(stack, job_id, who)[0] == 401
        assert http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "x"},
                    headers={**who, "Prefer": "respond-async"})[0] == 401
    assert finished(stack, job_id, ALICE)["state"] == "done"


def test_a_respond_async_predict_is_its_submitters_job(stack):
    code, job, headers = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "async, mine"},
                              headers={**BOB, "Prefer": "respond-async", "Idempotency-Key": "bob-async"})
    assert code == 202 and headers["Preference-Applied"] == "respond-async"
    assert finished(stack, job["id"], BOB)["state"] == "done"
    assert status(stack, job["id"], ALICE)[0] == 404 and cancel(stack, job["id"], ALICE)[0] == 404
    code, other, headers = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "async, mine"},
                                headers={**ALICE, "Prefer": "respond-async", "Idempotency-Key": "bob-async"})
    assert code == 202 and other["id"] != job["id"] and "Idempotent-Replayed" not in headers


def test_the_webhook_delivers_its_own_jobs_status_and_no_owner(stack):
    with WebhookReceiver() as receiver:
        code, job, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/jobs",
                            json_body={"texts": ["hooked one", "hooked two"], "webhook": receiver.url}, headers=ALICE)
        assert code == 202, job
        (headers, payload), = receiver.wait_for(1, timeout_s=60)
    delivered = json.loads(payload)
    assert delivered["id"] == job["id"] and delivered["state"] == "done"
    assert set(delivered) == {"id", "model", "model_version", "state", "progress", "created_ms", "finished_ms",
                              "ttl_s", "links"}
    everything = payload + json.dumps(headers).encode()
    for secret in (b"keyA", b"keyB", b"keyC", auth.owner_of("keyA").encode(), b"alice", b"owner"):
        assert secret not in everything, secret


def test_metrics_count_jobs_by_owner_label_never_a_key(stack):
    before = http("GET", f"{stack.url}/metrics", headers=OPS)[1]["_text"]
    count = metric(before, "funnel_jobs_submitted_total", model=TEXT, owner="bob") if 'owner="bob"' in before else 0
    submit(stack, ["counted"], BOB)
    after = http("GET", f"{stack.url}/metrics", headers=BOB)[1]["_text"]
    assert metric(after, "funnel_jobs_submitted_total", model=TEXT, owner="bob") == count + 1
    assert "keyB" not in after and auth.owner_of("keyB") not in after


def test_the_python_client_and_funnel_client_send_their_key(stack, tmp_path):
    with Client(stack.url, api_key="keyA") as alice, Client(stack.url, api_key="keyB") as bob, \
            Client(stack.url, api_key="keyC") as ops, Client(stack.url) as nobody:
        job = alice.submit_job(TEXT, corpus(30, "client"))
        assert alice.wait(job["id"], timeout=120, poll_s=0.1)["state"] == "done"
        assert len(list(alice.results(job["id"], page=8))) == 30
        assert len(list(alice.stream_results(job["id"]))) == 30
        for call in (lambda: bob.job_status(job["id"]), lambda: list(bob.stream_results(job["id"])),
                     lambda: list(bob.results(job["id"])), lambda: bob.cancel(job["id"])):
            with pytest.raises(NotFound) as refused:
                call()
            assert refused.value.code == "unknown_job"
        with pytest.raises(Unauthorized):
            nobody.job_status(job["id"])
        assert ops.job_status(job["id"])["state"] == "done"
    lines = corpus(40, "cli")
    source, out = tmp_path / "corpus.txt", tmp_path / "vectors.jsonl"
    source.write_text("\n".join(lines) + "\n")
    done = run_script("funnel-client", "--url", stack.url, "--api-key", "keyB", "--model", TEXT, "--bulk",
                      str(source), "--output", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 40
    job_id = done.stderr.split()[1].rstrip(":")
    assert status(stack, job_id, BOB)[0] == 200 and status(stack, job_id, ALICE)[0] == 404
    refused = run_script("funnel-client", "--url", stack.url, "--model", TEXT, "--bulk", str(source), "--quiet")
    assert refused.returncode == 1 and "401" in refused.stderr


# -- the web app alone: no worker, jobs stay queued ------------------------------------------------

PREFIX = "ownership-test"


@pytest.fixture(scope="module")
def app(redis_server, model_store):
    return flask_app(redis_server, model_store, PREFIX, "--models", TEXT, "--api-keys", API_KEYS,
                     "--admin-keys", "ops")


@pytest.fixture()
def client(redis_client):
    return redis_client


def commands(client, call):
    """What one call returns, and the Redis commands (and how many of each) it made, from the server's
    own counts."""
    client.config_resetstat()
    answer = call()
    stats = client.info("commandstats")
    return answer, {name: stat["calls"] for name, stat in stats.items()
                    if name not in ("cmdstat_info", "cmdstat_config")}


def test_a_404_for_another_keys_job_costs_what_one_for_a_missing_id_does(app, client):
    web = app.test_client()
    job_id = web.post(f"/v1/models/{TEXT}/jobs", json={"texts": ["alice's"]}, headers=ALICE).json["id"]
    never = jobs.new_job_id()
    for method, path in [("GET", "/v1/jobs/{}?limit=0"), ("GET", "/v1/jobs/{}?limit=50"),
                         ("GET", "/v1/jobs/{}/results"), ("DELETE", "/v1/jobs/{}")]:
        (foreign, foreign_made), (missing, missing_made) = (
            commands(client, functools.partial(web.open, path.format(target), method=method, headers=BOB))
            for target in (job_id, never))
        assert foreign.status_code == missing.status_code == 404, path
        assert foreign.data.replace(job_id.encode(), never.encode()) == missing.data
        assert foreign_made == missing_made, path  # the same Redis work
        assert foreign_made, path  # and some: a missing id is looked up, not guessed
    assert client.hget(Keys(PREFIX).job(job_id), "state") == b"active"  # bob's DELETE changed nothing
    # And about the same time: medians of interleaved requests, with a bound wide enough for a busy host.
    times: dict[str, list[float]] = {job_id: [], never: []}
    for _ in range(150):
        for target in (job_id, never):
            started = time.perf_counter()
            web.get(f"/v1/jobs/{target}?limit=10", headers=BOB)
            times[target].append(time.perf_counter() - started)
    foreign, missing = statistics.median(times[job_id]), statistics.median(times[never])
    assert abs(foreign - missing) < 0.5 * max(foreign, missing) + 0.0005, (foreign, missing)


def test_funnel_inspect_shows_a_bulk_items_owner_label(app, client, redis_server, capsys):
    from funnel.scripts import inspect_redis

    job_id = app.test_client().post(f"/v1/models/{TEXT}/jobs", json={"texts": ["inspect me"]},
                                    headers=ALICE).json["id"]
    assert inspect_redis.main(["--redis-url", redis_server.url, "--prefix", PREFIX, "show",
                               Keys(PREFIX).bulk(TEXT)]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["job"] == job_id and shown["job_owner"] == "alice"
    assert "keyA" not in out and auth.owner_of("keyA") not in out


def test_the_admin_marking_that_opens_every_job_also_guards_the_traffic_policy(app, client):
    """One marking, read in one place (web/auth.py's is_admin): FUNNEL_ADMIN_KEYS=ops."""
    web, path, weights = app.test_client(), f"/v1/models/{TEXT}/traffic", {"weights": {"1": 100}}
    assert web.put(path, json=weights).status_code == 401
    for who in (ALICE, BOB):
        refused = web.put(path, json=weights, headers=who)
        assert refused.status_code == 403 and refused.json["error"]["code"] == "forbidden"
        assert web.delete(path, headers=who).status_code == 403
    assert web.put(path, json=weights, headers=OPS).status_code == 200
    assert web.delete(path, headers=OPS).status_code == 200
