"""Job webhooks on a live stack, delivered to a receiver on 127.0.0.1: signed and verified, retried
after errors with the attempts in the job's status, given up after FUNNEL_WEBHOOK_ATTEMPTS, made due
by a cancel, and refused at submit for destinations that are not allowed (SSRF)."""

from __future__ import annotations

import time

import pytest

from funnel.scripts.stack import Stack
from funnel_client import WebhookVerificationError, verify_webhook
from tests.support import WebhookReceiver, http, wait_for

TEXT = "text-embedding"
SECRET = "test-webhook-secret"
ATTEMPTS, BACKOFF_S = 3, 0.3
SETTINGS = {"FUNNEL_WEBHOOK_SECRET": SECRET, "FUNNEL_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"}

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    with Stack(model_store=model_store, models=[TEXT], log_dir=tmp_path_factory.mktemp("webhooks"),
               web_env=SETTINGS,
               worker_env={**SETTINGS, "FUNNEL_WEBHOOK_ATTEMPTS": str(ATTEMPTS),
                           "FUNNEL_WEBHOOK_BACKOFF_S": str(BACKOFF_S), "FUNNEL_WEBHOOK_TIMEOUT_S": "2"}) as running:
        yield running


def submit(stack, texts, webhook=None, headers=None):
    body = {"texts": texts, **({"webhook": webhook} if webhook is not None else {})}
    return http("POST", f"{stack.url}/v1/models/{TEXT}/jobs", json_body=body, headers=headers)


def job(stack, job_id):
    return http("GET", f"{stack.url}/v1/jobs/{job_id}?limit=0")[1]


def settled(stack, job_id, timeout_s=60):
    return wait_for(lambda: (lambda s: s if s["webhook"]["state"] in ("delivered", "failed") else None)(
        job(stack, job_id)), timeout_s=timeout_s, interval_s=0.05, what="webhook settled")


def test_delivered_once_signed_with_the_jobs_final_status(stack):
    with WebhookReceiver() as receiver:
        code, body, _ = submit(stack, ["first passage", "second passage"], receiver.url)
        assert code == 202, body
        assert body["webhook"] == {"url": receiver.url, "state": "pending", "attempts": 0, "last_status": None,
                                   "last_error": None, "next_attempt_ms": None}
        final = settled(stack, body["id"])
        (headers, payload), = receiver.wait_for(1)
    assert final["webhook"]["state"] == "delivered" and final["webhook"]["attempts"] == 1
    assert final["webhook"]["last_status"] == 200 and final["webhook"]["next_attempt_ms"] is None
    status = verify_webhook(SECRET, headers, payload)
    assert status["id"] == body["id"] and status["state"] == "done"
    assert status["progress"] == {"done": 2, "total": 2, "failed": 0}
    assert status["links"] == {"self": f"/v1/jobs/{body['id']}", "results": f"/v1/jobs/{body['id']}/results"}
    assert "results" not in status and "webhook" not in status  # the status, not the results
    assert headers["Funnel-Webhook-Id"] == body["id"] and headers["Content-Type"] == "application/json"
    with pytest.raises(WebhookVerificationError):
        verify_webhook("another-secret", headers, payload)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(SECRET, headers, payload.replace(b'"done"', b'"failed"'))
    with pytest.raises(WebhookVerificationError):  # replayed an hour later
        verify_webhook(SECRET, headers, payload, now=time.time() + 3600)


def test_retried_after_errors_with_the_attempts_in_the_status(stack):
    with WebhookReceiver([500, 503]) as receiver:
        job_id = submit(stack, ["retried passage"], receiver.url)[1]["id"]
        seen = []  # the status as it goes, to catch the pending state between attempts
        final = wait_for(lambda: (lambda s: seen.append(s["webhook"]) or (
            s if s["webhook"]["state"] != "pending" else None))(job(stack, job_id)),
            timeout_s=60, interval_s=0.02, what="webhook settled")
        deliveries = receiver.wait_for(3)
    assert final["webhook"]["state"] == "delivered", final
    assert final["webhook"]["attempts"] == 3 and final["webhook"]["last_status"] == 200
    between = [w for w in seen if w["attempts"] >= 1 and w["last_status"] in (500, 503)]
    assert between and all(w["next_attempt_ms"] and w["last_error"].startswith("answered HTTP 50") for w in between)
    assert len(deliveries) == 3
    assert [h["Funnel-Webhook-Attempt"] for h, _ in deliveries] == ["1", "2", "3"]
    assert all(verify_webhook(SECRET, h, b)["id"] == job_id for h, b in deliveries)


def test_given_up_after_the_attempts_when_nothing_listens(stack):
    with WebhookReceiver() as receiver:
        closed = receiver.url  # the port is closed once the receiver is gone
    job_id = submit(stack, ["nobody listens"], closed)[1]["id"]
    final = settled(stack, job_id)
    assert final["webhook"]["state"] == "failed" and final["webhook"]["attempts"] == ATTEMPTS
    assert final["webhook"]["last_status"] is None and "could not connect" in final["webhook"]["last_error"]
    assert final["state"] == "done"  # the job itself is unaffected


def test_a_cancel_makes_the_webhook_due_and_a_predict_takes_one_in_a_header(stack):
    with WebhookReceiver() as receiver:
        job_id = submit(stack, [f"long job {i} " + "word " * (i % 50) for i in range(3000)], receiver.url)[1]["id"]
        assert http("DELETE", f"{stack.url}/v1/jobs/{job_id}")[1]["state"] == "cancelled"
        (headers, payload), = receiver.wait_for(1)
        assert verify_webhook(SECRET, headers, payload)["state"] in ("cancelled", "done")
        code, body, response_headers = http("POST", f"{stack.url}/v1/models/{TEXT}/predict",
                                            json_body={"text": "one async predict"},
                                            headers={"Prefer": "respond-async", "Webhook-URL": receiver.url})
        assert code == 202 and response_headers["Preference-Applied"] == "respond-async"
        (headers, payload) = receiver.wait_for(2)[1]
        assert verify_webhook(SECRET, headers, payload)["id"] == body["id"]
        assert settled(stack, job_id)["webhook"]["attempts"] == 1  # once, even if its last items finished after


@pytest.mark.parametrize("url", [
    "http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data/", "http://[::1]:8080/hook",
    "http://192.168.1.1:8080/hook", "http://0.0.0.0/hook", "http://[::ffff:10.0.0.1]/hook",
    "ftp://example.com/hook", "file:///etc/passwd", "http://user:password@example.com/hook", "http:///hook",
    "http://example.com/" + "x" * 2100, "http://example.com/a b", "http://127.0.0.1:99999/hook", "not a url"])
def test_refused_destinations_are_a_400(stack, url):
    code, body, _ = submit(stack, ["refused"], url)
    assert code == 400 and body["error"]["code"] == "bad_webhook", body


def test_a_webhook_given_twice_or_without_a_job_is_a_400(stack):
    with WebhookReceiver() as receiver:
        code, body, _ = submit(stack, ["twice"], receiver.url, headers={"Webhook-URL": receiver.url})
        assert code == 400 and body["error"]["code"] == "bad_webhook"
        code, body, _ = http("POST", f"{stack.url}/v1/models/{TEXT}/predict", json_body={"text": "sync"},
                             headers={"Webhook-URL": receiver.url})
        assert code == 400 and "respond-async" in body["error"]["message"]
        assert submit(stack, ["not a string"], 42)[0] == 400
    assert receiver.deliveries == []
