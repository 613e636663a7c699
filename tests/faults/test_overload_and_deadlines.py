"""A full queue answers 503 at once; a request nobody answers in time gets 504 and its job is dropped."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from funnel.scripts.stack import Stack
from tests.support import Outcome, http, stray_replies, wait_for

IMAGE = "image-classifier"


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    """Both models served, but no image worker: image jobs wait until a test starts one."""
    with Stack(model_store=model_store, workers=["text-embedding"],
               log_dir=tmp_path_factory.mktemp("overload"),
               # Held, not shed: these tests need image jobs queued while no image worker runs.
               web_env={"FUNNEL_MAX_QUEUE": "4", "FUNNEL_REQUEST_TIMEOUT_S": "2",
                        "FUNNEL_HOLD_WITHOUT_WORKERS": "1"}) as running:
        yield running


@pytest.fixture()
def client(stack):
    client = redis.Redis.from_url(stack.redis_url)
    client.delete(f"funnel:queue:{{{IMAGE}}}:1")
    return client


def post_image(stack, jpeg):
    started = time.monotonic()
    status, body, headers = http("POST", f"{stack.url}/v1/models/{IMAGE}/predict", body=jpeg,
                                 headers={"Content-Type": "image/jpeg"})
    return status, body, headers, time.monotonic() - started


def test_a_full_queue_answers_503_and_stays_at_its_length(stack, client, cat_jpeg, report):
    client.lpush(f"funnel:queue:{{{IMAGE}}}:1", *[b"placeholder"] * 4)
    outcome = Outcome()
    for _ in range(5):
        status, body, headers, seconds = post_image(stack, cat_jpeg)
        outcome.add(status, seconds)
        assert status == 503 and body["error"]["code"] == "overloaded"
        assert headers["Retry-After"] == "1"
        assert seconds < 1.0
    assert client.llen(f"funnel:queue:{{{IMAGE}}}:1") == 4
    report(outcome, stray_replies(client, stack))


def test_concurrent_requests_never_overfill_the_queue(stack, client, cat_jpeg, report):
    outcome = Outcome()
    with ThreadPoolExecutor(max_workers=12) as pool:
        for status, _, _, seconds in pool.map(lambda _: post_image(stack, cat_jpeg), range(12)):
            outcome.add(status, seconds)
    # Four got in (and timed out, nobody serves images here); the rest were turned away.
    assert outcome.statuses == {504: 4, 503: 8}, outcome.statuses
    report(outcome, 0)


def test_no_reply_in_time_is_504_and_the_late_job_is_dropped(stack, client, cat_jpeg, report):
    outcome = Outcome()
    status, body, _, seconds = post_image(stack, cat_jpeg)
    outcome.add(status, seconds)
    assert status == 504 and body["error"]["code"] == "timeout"
    assert 1.9 < seconds < 4
    assert client.llen(f"funnel:queue:{{{IMAGE}}}:1") == 1
    worker = stack.start_worker(IMAGE, FUNNEL_WORKER_ID="late-image")
    wait_for(lambda: client.hget(f"funnel:worker:{{{IMAGE}}}:late-image", "expired") == b"1",
             what="expired job dropped")
    assert client.llen(f"funnel:queue:{{{IMAGE}}}:1") == 0
    assert stray_replies(client, stack) == 0  # dropped, never answered
    worker.terminate()
    assert worker.wait(timeout=30) == 0
    report(outcome, 0)
