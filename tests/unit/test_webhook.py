"""Webhooks without a stack: URL policy (common/bulk/webhooks.py), signing against the client's
verify_webhook, the enqueue with the final state, and the deliverer's claim, lease, retries and
attempt (worker/webhook.py) against a real Redis and a receiver on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from funnel.common.bulk import jobs, webhooks
from funnel.common.bulk.job_store import JobStore
from funnel.common.bulk.job_submit import SubmitLimits, check_webhook
from funnel.common.contracts.wire import Reply, now_ms
from funnel.common.errors import BadInput
from funnel.worker.reply import Replier
from funnel.worker.settings import WorkerSettings
from funnel.worker.webhook import Deliverer, DeliveryFailed, backoff_ms, post
from funnel_client import WebhookVerificationError, verify_webhook
from tests.support import WebhookReceiver, wait_for

SECRET = "unit-secret"


def resolver_of(*addresses: str):
    """A getaddrinfo stand-in that resolves every name to these addresses."""
    def resolve(host, port, type=0):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses]
    return resolve


# -- where a webhook may go ----------------------------------------------------


def test_a_url_becomes_its_destination():
    dest = webhooks.parse("https://hooks.example.com/funnel/done?team=7#ignored")
    assert (dest.scheme, dest.host, dest.port, dest.netloc, dest.target) == (
        "https", "hooks.example.com", 443, "hooks.example.com", "/funnel/done?team=7")
    dest = webhooks.parse("http://[2606:4700::1]:8080")
    assert (dest.host, dest.port, dest.netloc, dest.target) == ("2606:4700::1", 8080, "[2606:4700::1]:8080", "/")


@pytest.mark.parametrize("url", ["", "ftp://example.com/", "javascript:alert(1)", "http://u:p@example.com/",
                                 "http://user@example.com/", "http:///path", "http://example.com:0x50/",
                                 "http://example.com/\r\nX-Injected: 1", "http://exämple.com/",
                                 "http://example.com/" + "a" * webhooks.MAX_URL])
def test_malformed_urls_are_refused(url):
    with pytest.raises(webhooks.Refused):
        webhooks.parse(url)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254",
                                     "100.64.0.1", "0.0.0.0", "224.0.0.1", "::1", "fe80::1", "fd00::1",
                                     "::ffff:127.0.0.1", "::ffff:10.0.0.1"])
def test_private_loopback_and_link_local_addresses_are_refused(address):
    dest = webhooks.parse("http://hooks.example.com/")
    with pytest.raises(webhooks.Refused, match="private, loopback or link-local"):
        webhooks.resolve(dest, [], resolver_of(address))


def test_the_allow_list_names_hosts_addresses_or_networks():
    dest = webhooks.parse("http://hooks.internal:8080/")
    assert webhooks.resolve(dest, [], resolver_of("8.8.8.8")) == ["8.8.8.8"]
    assert webhooks.resolve(dest, ["hooks.internal"], resolver_of("10.0.0.5")) == ["10.0.0.5"]
    assert webhooks.resolve(dest, ["10.0.0.5"], resolver_of("10.0.0.5")) == ["10.0.0.5"]
    assert webhooks.resolve(dest, ["10.0.0.0/8"], resolver_of("10.9.9.9")) == ["10.9.9.9"]
    with pytest.raises(webhooks.Refused):
        webhooks.resolve(dest, ["10.0.0.0/8", "other.internal"], resolver_of("192.168.0.1"))
    # A name that resolves to a public and a private address: only the public one is ever connected to.
    assert webhooks.resolve(dest, [], resolver_of("10.0.0.1", "8.8.4.4")) == ["8.8.4.4"]


def test_a_name_that_does_not_resolve_is_refused():
    def fails(*args, **kwargs):
        raise socket.gaierror("Name or service not known")
    with pytest.raises(webhooks.Refused, match="does not resolve"):
        webhooks.check("http://nowhere.invalid/", [], fails)


# -- signing ---------------------------------------------------------------------


def test_the_signature_verifies_with_the_client_helper():
    body, t = b'{"id":"abc","state":"done"}', int(time.time())
    header = webhooks.signature(SECRET, body, t)
    assert header.startswith(f"t={t},v1=") and len(header.split("v1=")[1]) == 64
    assert verify_webhook(SECRET, {"funnel-signature": header}, body) == {"id": "abc", "state": "done"}
    rotated = f"{header},v1={'0' * 64}"  # several v1 values (a secret being rotated): any one may match
    assert verify_webhook(SECRET, {"Funnel-Signature": rotated}, body)["id"] == "abc"
    for headers, payload, now in [({"Funnel-Signature": header}, body + b" ", None),
                                  ({"Funnel-Signature": header.replace(f"t={t}", f"t={t + 1}")}, body, None),
                                  ({}, body, None), ({"Funnel-Signature": "v1=abc"}, body, None),
                                  ({"Funnel-Signature": header}, body, t + 301)]:
        with pytest.raises(WebhookVerificationError):
            verify_webhook(SECRET, headers, payload, now=now)


# -- the enqueue goes with the final state ---------------------------------------------------------


def make_job(client, keys, total: int, webhook: str | None = "http://127.0.0.1:9/hook") -> str:
    job_id = jobs.new_job_id()
    client.hset(keys.job(job_id), mapping={"model": "m", "total": total, "done": 0, "failed": 0, "duplicates": 0,
                                           "created_ms": now_ms(), "ttl_ms": 60_000, "state": "active",
                                           **({"webhook_url": webhook} if webhook else {})})
    return job_id


def store(client, keys, job_id: str, *indices: int) -> None:
    results = keys.job_results(job_id)
    replies = [(results, Reply(id=jobs.item_id(job_id, i), ok=True, outputs={"y": np.ones(1, np.float32)}))
               for i in indices]
    Replier(client, keys, worker_id="w1", model="m", ttl_s=60).answer(replies, [])


def test_the_last_stored_item_makes_the_webhook_due_once(redis_client, keys):
    job_id = make_job(redis_client, keys, 3)
    store(redis_client, keys, job_id, 0, 1)
    assert redis_client.zscore(keys.webhooks_due(), job_id) is None  # not final yet
    record = jobs.Record.parse(job_id, redis_client.hgetall(keys.job(job_id)))
    assert record.status()["webhook"]["state"] == "pending" and record.status()["webhook"]["next_attempt_ms"] is None
    store(redis_client, keys, job_id, 2)
    due = redis_client.zscore(keys.webhooks_due(), job_id)
    assert due and abs(due - now_ms()) < 5000
    record = jobs.Record.parse(job_id, redis_client.hgetall(keys.job(job_id)))
    assert record.webhook_state == "pending" and record.webhook_next_ms == due
    redis_client.zrem(keys.webhooks_due(), job_id)
    store(redis_client, keys, job_id, 2)  # a duplicate answer: not final a second time
    assert redis_client.zscore(keys.webhooks_due(), job_id) is None
    plain = make_job(redis_client, keys, 1, webhook=None)
    store(redis_client, keys, plain, 0)
    assert redis_client.zcard(keys.webhooks_due()) == 0
    assert "webhook" not in jobs.Record.parse(plain, redis_client.hgetall(keys.job(plain))).status()


def test_a_cancel_makes_the_webhook_due_once(redis_client, keys):
    job_store = JobStore(redis_client, keys, ttl_s=60)
    job_id = make_job(redis_client, keys, 5)
    assert job_store.cancel(job_id, jobs.Caller.anyone()).state == "cancelled"
    assert redis_client.zscore(keys.webhooks_due(), job_id) is not None
    redis_client.zrem(keys.webhooks_due(), job_id)
    job_store.cancel(job_id, jobs.Caller.anyone())  # again: already pending, not due a second time
    assert redis_client.zscore(keys.webhooks_due(), job_id) is None
    store(redis_client, keys, job_id, 0, 1, 2, 3, 4)  # its last items finish after the cancel: still once
    assert redis_client.zscore(keys.webhooks_due(), job_id) is None


# -- on a Redis Cluster the due mark is a step of its own: the paths that mend a lost one -----------
# Keys(cluster=True) on one real Redis runs the cluster's code paths (the scripts given no due set,
# the mark apart); a real cluster runs them end to end in tests/integration/test_cluster.py.


def test_on_a_cluster_the_store_marks_the_webhook_due_apart_and_a_second_answer_mends_a_lost_mark(redis_client,
                                                                                                  keys):
    cluster = type(keys)(keys.prefix, cluster=True)
    job_id = make_job(redis_client, cluster, 2)
    store(redis_client, cluster, job_id, 0, 1)
    assert redis_client.zscore(keys.webhooks_due(), job_id) is not None
    assert webhook_of(redis_client, keys, job_id)["state"] == "pending"
    redis_client.zrem(keys.webhooks_due(), job_id)  # the worker died between the store and its mark
    store(redis_client, cluster, job_id, 1)  # so its items ran again: their second answer marks it
    assert redis_client.zscore(keys.webhooks_due(), job_id) is not None
    record = jobs.Record.parse(job_id, redis_client.hgetall(keys.job(job_id)))
    assert (record.done, record.duplicates) == (2, 1)


def test_on_a_cluster_a_cancels_lost_mark_is_mended_by_the_worker_dropping_its_items(redis_client, keys):
    from funnel.common.contracts.wire import Job, encode_job

    cluster = type(keys)(keys.prefix, cluster=True)
    job_store = JobStore(redis_client, cluster, ttl_s=60)
    job_id = make_job(redis_client, cluster, 3)
    assert job_store.cancel(job_id, jobs.Caller.anyone()).state == "cancelled"
    assert redis_client.zscore(keys.webhooks_due(), job_id) is not None
    redis_client.zrem(keys.webhooks_due(), job_id)  # the web process died between the cancel and its mark
    items = [encode_job(Job(id=jobs.item_id(job_id, i), model="m", items=[{"x": np.zeros(1, np.int32)}],
                            reply_to=cluster.job_results(job_id), deadline=now_ms() + 60_000)) for i in range(3)]
    kept, dropped = jobs.drop_stopped(redis_client, cluster, items)
    assert (kept, dropped) == ([], 3)
    assert redis_client.zscore(keys.webhooks_due(), job_id) is not None


def test_a_settles_lost_score_and_a_dead_lease_are_mended_by_the_next_claim(redis_client, keys):
    with WebhookReceiver([500, 200]) as receiver:
        job_id = final_job(redis_client, keys, receiver.url)
        worker = deliverer(redis_client, keys)
        assert worker.deliver_one()  # a 500: a retry 50 ms on
        due = redis_client.zscore(keys.webhooks_due(), job_id)
        redis_client.zadd(keys.webhooks_due(), {job_id: now_ms() - 1})  # as if the settle's score was lost
        assert worker.claim("early") is None  # its retry is not due yet: back at its time, not attempted
        assert redis_client.zscore(keys.webhooks_due(), job_id) == due
        assert webhook_of(redis_client, keys, job_id)["attempts"] == 1
        redis_client.hset(keys.job(job_id), "webhook_next_ms", now_ms() - 1)
        redis_client.zadd(keys.webhooks_due(), {job_id: now_ms() - 1})
        leased = worker._lease(keys=[keys.webhooks_due()], args=[now_ms(), 200])  # and its claimer died
        assert leased.decode() == job_id and worker.claim("meanwhile") is None
        wait_for(worker.deliver_one, timeout_s=5, interval_s=0.01, what="the lease to run out")
    hook = webhook_of(redis_client, keys, job_id)
    assert (hook["state"], hook["attempts"]) == ("delivered", 2) and len(receiver.deliveries) == 2
    assert redis_client.zcard(keys.webhooks_due()) == 0


def test_a_submit_naming_a_webhook_needs_the_secret():
    with pytest.raises(BadInput) as refused:
        check_webhook("https://hooks.example.com/", SubmitLimits(max_bulk_queue=10))
    assert refused.value.code == "webhooks_disabled"
    with pytest.raises(BadInput) as refused:
        check_webhook("http://10.0.0.1/", SubmitLimits(max_bulk_queue=10, webhook_secret=SECRET))
    assert refused.value.code == "bad_webhook"
    check_webhook("http://10.0.0.1/", SubmitLimits(max_bulk_queue=10, webhook_secret=SECRET,
                                                    webhook_allow_hosts=["10.0.0.0/8"]))


# -- claims, leases, retries -----------------------------------------------------


def deliverer(redis_client, keys, worker_id="w1", **settings) -> Deliverer:
    base = {"model": "m", "worker_id": worker_id, "webhook_secret": SECRET, "webhook_allow_hosts": ["127.0.0.1"],
            "webhook_timeout_s": 2.0, "webhook_backoff_s": 0.05, "webhook_attempts": 3}
    return Deliverer(redis_client, keys, WorkerSettings(**{**base, **settings}))


def final_job(redis_client, keys, url: str) -> str:
    job_id = make_job(redis_client, keys, 1, webhook=url)
    store(redis_client, keys, job_id, 0)
    return job_id


def webhook_of(redis_client, keys, job_id: str) -> dict:
    return jobs.Record.parse(job_id, redis_client.hgetall(keys.job(job_id))).status()["webhook"]


def test_delivered_then_forgotten(redis_client, keys):
    with WebhookReceiver() as receiver:
        job_id = final_job(redis_client, keys, receiver.url)
        assert deliverer(redis_client, keys).deliver_one()
        (headers, body), = receiver.deliveries
    assert webhook_of(redis_client, keys, job_id) == {
        "url": receiver.url, "state": "delivered", "attempts": 1, "last_status": 200, "last_error": None,
        "next_attempt_ms": None}
    assert verify_webhook(SECRET, headers, body)["state"] == "done"
    assert headers["Host"] == receiver.url.split("/")[2] and receiver.paths == ["/hooks/funnel?source=test"]
    assert redis_client.zcard(keys.webhooks_due()) == 0
    assert not deliverer(redis_client, keys).deliver_one()  # nothing due


def test_errors_are_retried_with_backoff_then_given_up(redis_client, keys):
    with WebhookReceiver([500, 502, 503]) as receiver:
        job_id = final_job(redis_client, keys, receiver.url)
        worker = deliverer(redis_client, keys)
        assert worker.deliver_one()
        hook = webhook_of(redis_client, keys, job_id)
        assert (hook["state"], hook["attempts"], hook["last_status"]) == ("pending", 1, 500)
        assert hook["next_attempt_ms"] == redis_client.zscore(keys.webhooks_due(), job_id) > now_ms()
        assert not worker.deliver_one()  # not due yet: the backoff
        for _ in (2, 3):  # due again after 0.05 s, then 0.1 s
            wait_for(worker.deliver_one, timeout_s=5, interval_s=0.01, what="the next attempt due")
    hook = webhook_of(redis_client, keys, job_id)
    assert (hook["state"], hook["attempts"], hook["last_status"], hook["next_attempt_ms"]) == ("failed", 3, 503, None)
    assert redis_client.zcard(keys.webhooks_due()) == 0 and len(receiver.deliveries) == 3


def test_a_dead_deliverers_claim_comes_back_after_its_lease_and_its_late_answer_is_ignored(redis_client, keys):
    job_id = final_job(redis_client, keys, "http://127.0.0.1:9/never-asked")
    dead = deliverer(redis_client, keys, "dead", webhook_timeout_s=0.05)  # a lease of 0.2 s
    claimed = dead.claim("dead token")
    assert claimed is not None and claimed.id == job_id  # ... and then the process died
    with WebhookReceiver() as receiver:
        redis_client.hset(keys.job(job_id), "webhook_url", receiver.url)
        live = deliverer(redis_client, keys, "live")
        assert not live.deliver_one()  # leased
        wait_for(live.deliver_one, timeout_s=5, interval_s=0.01, what="the lease to run out")
        assert len(receiver.deliveries) == 1
    # The dead claimer's answer, had it come late, changes nothing.
    assert not dead.settle(claimed, "dead token", "retry", 500, "late", now_ms())
    hook = webhook_of(redis_client, keys, job_id)
    assert (hook["state"], hook["attempts"]) == ("delivered", 2)
    assert redis_client.zcard(keys.webhooks_due()) == 0  # nor puts it back in the due set


def test_attempts_used_up_by_dead_claimers_end_failed(redis_client, keys):
    job_id = final_job(redis_client, keys, "http://127.0.0.1:9/never-asked")
    redis_client.hset(keys.job(job_id), "webhook_attempts", 3)
    assert not deliverer(redis_client, keys).deliver_one()
    hook = webhook_of(redis_client, keys, job_id)
    assert hook["state"] == "failed" and "never ended" in hook["last_error"]
    assert redis_client.zcard(keys.webhooks_due()) == 0


def test_deliveries_of_expired_jobs_are_dropped(redis_client, keys):
    redis_client.zadd(keys.webhooks_due(), {"f" * 32: now_ms()})
    assert not deliverer(redis_client, keys).deliver_one()
    assert redis_client.zcard(keys.webhooks_due()) == 0


def test_the_backoff_doubles_to_about_an_hour_over_eight_attempts():
    waits = [backoff_ms(n, 30.0) for n in range(1, 8)]  # after each of the first 7 failures
    assert all(30_000 * 2 ** i <= w <= 33_000 * 2 ** i for i, w in enumerate(waits))
    assert 60 * 60_000 < sum(waits) < 70 * 60_000


def test_the_running_thread_delivers_and_stops(redis_client, keys):
    with WebhookReceiver() as receiver:
        final_job(redis_client, keys, receiver.url)
        worker = deliverer(redis_client, keys).start()
        try:
            receiver.wait_for(1, timeout_s=10)
        finally:
            worker.stop()
    assert not worker._thread.is_alive()


# -- one attempt -------------------------------------------------------------------------------------


def test_an_answer_that_never_comes_times_out():
    with WebhookReceiver([None]) as receiver:
        started = time.monotonic()
        with pytest.raises(DeliveryFailed, match="no answer within 0.3 s"):
            post(receiver.url, b"{}", {}, ["127.0.0.1"], 0.3)
        assert time.monotonic() - started < 2


def serve_raw(answer: bytes):
    """A server on 127.0.0.1 that answers one connection with these bytes: (url, its thread)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run():
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(65536)
            try:
                connection.sendall(answer)
            except OSError:
                pass  # the deliverer stopped reading, as it should

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/hook", thread


def test_redirects_are_not_followed_and_answers_not_read_past_the_status_line():
    url, thread = serve_raw(b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\n\r\n")
    with pytest.raises(DeliveryFailed) as failed:
        post(url, b"{}", {}, ["127.0.0.1"], 2)
    assert failed.value.status == 302
    thread.join(5)
    url, thread = serve_raw(b"HTTP/1.1 204 No Content\r\n" + b"X-Filler: " + b"x" * 10_000_000)
    assert post(url, b"{}", {}, ["127.0.0.1"], 2) == 204
    thread.join(5)
    url, thread = serve_raw(b"SSH-2.0-OpenSSH\r\n")
    with pytest.raises(DeliveryFailed, match="no HTTP answer"):
        post(url, b"{}", {}, ["127.0.0.1"], 2)
    thread.join(5)


def test_the_address_is_checked_again_at_delivery(monkeypatch):
    """DNS rebinding: a name that was public at submit and resolves to a private address now."""
    monkeypatch.setattr(socket, "getaddrinfo", resolver_of("10.0.0.7"))
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(DeliveryFailed, match="refused: .*10.0.0.7"):
        post("http://rebound.example.com/hook", b"{}", {}, [], 2)
