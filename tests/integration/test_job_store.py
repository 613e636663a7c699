"""The job store (common/bulk/job_store.py) and the submit (web/pipeline.py's submit_job) against a real
redis-server: a job created whole, replayed by Idempotency-Key (same body: the job; another body:
422), concurrent submits with one key making one job, unknown (404) against expired (410) ids,
cancel, pages of results, the bulk queue's limit, a bad item named by its index."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis

from funnel.common import tasks
from funnel.common.bulk import jobs
from funnel.common.bulk.job_store import Conflict, Gone, Items, JobStore
from funnel.common.bulk.job_submit import SubmitLimits
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Reply, decode_job, decode_reply, encode_reply, now_ms
from funnel.common.errors import BadInput, NotFound, Overloaded
from funnel.common.link.connection import connect, scan_keys
from funnel.common.store import load_spec
from funnel.web.catalog import Catalog
from funnel.web.pipeline import Pipeline
from funnel.web.settings import WebSettings
from funnel.worker.reply import Replier
from tests.cutting_proxy import CuttingProxy
from tests.support import wait_for

MODEL = "text-embedding"
TTL_S = 60
LIMITS = SubmitLimits(max_bulk_queue=1000, webhook_secret="secret", webhook_allow_hosts=["127.0.0.1"])
HOOK = "http://127.0.0.1:9/hook"
SERVED: list[Catalog] = []  # the catalog the module's submits resolve models in (fixture `served`)


@pytest.fixture(scope="module")
def task(model_store):
    return tasks.load(load_spec(model_store, MODEL))


@pytest.fixture(scope="module", autouse=True)
def served(model_store, tmp_path_factory):
    """A store serving the text model under its own name and another (submit_job resolves the name)."""
    store = tmp_path_factory.mktemp("job-store-models")
    for name in (MODEL, "another-model"):
        (store / name).symlink_to(model_store / MODEL, target_is_directory=True)
    SERVED.append(Catalog(store, [MODEL, "another-model"], {}))


@pytest.fixture()
def store(redis_client, keys) -> JobStore:
    return JobStore(redis_client, keys, ttl_s=TTL_S)


ANYONE = jobs.Caller.anyone()  # a server with no API keys


def make(store, task, texts, key=None, body=None, webhook=None, limits=LIMITS, model=MODEL, caller=ANYONE):
    """The web tier's submit_job (web/pipeline.py) as a route calls it, over this store: the raw body
    defaults to the texts themselves."""
    raw = body if body is not None else "\n".join(texts).encode()
    settings = WebSettings(max_bulk_queue=limits.max_bulk_queue, webhook_secret=limits.webhook_secret,
                           webhook_allow_hosts=limits.webhook_allow_hosts, job_ttl_s=store.ttl_s)
    pipeline = Pipeline(SERVED[0], store.client, store.keys, settings)
    pipeline.bulk_jobs = store
    return pipeline.submit_job(model, texts, key, webhook, raw, caller)


def reply_to(redis_client, keys, job_id: str, *indices: int, ok: bool = True) -> None:
    """Items answered as a worker answers them (worker/reply.py)."""
    results = keys.job_results(job_id)
    replies = [(results, Reply(id=jobs.item_id(job_id, i), ok=True, outputs={"y": np.full(2, i, np.float32)})
                if ok else Reply.failure(jobs.item_id(job_id, i), "bad_input", "no")) for i in indices]
    Replier(redis_client, keys, worker_id="w1", model=MODEL, ttl_s=60).answer(replies, [])


def test_a_job_is_created_whole(store, task, redis_client, keys):
    texts = ["first passage", "second passage", "third passage"]
    record, replayed = make(store, task, texts, webhook=HOOK)
    assert not replayed and jobs.is_job_id(record.id)
    assert (record.model, record.total, record.state, record.webhook_url) == (MODEL, 3, "queued", HOOK)
    loaded, payloads = store.load(record.id, ANYONE, 0, 10)
    assert loaded == record and payloads == [None, None, None]
    queued = [decode_job(raw) for raw in redis_client.lrange(keys.bulk(MODEL), 0, -1)[::-1]]  # oldest first
    assert [j.id for j in queued] == [jobs.item_id(record.id, i) for i in range(3)]
    assert all(j.reply_to == keys.job_results(record.id) and j.model == MODEL for j in queued)
    assert queued[1].items[0]["input_ids"].tolist() == task.preprocess(texts[1])["input_ids"].tolist()
    assert 0 < redis_client.pttl(keys.job(record.id)) <= TTL_S * 1000


def test_a_bad_item_fails_the_submit_by_index_and_writes_nothing(store, task, redis_client, keys):
    with pytest.raises(BadInput) as bad:
        make(store, task, ["fine", "   ", "fine too"])
    assert bad.value.message.startswith("item 1:")
    assert redis_client.dbsize() == 0


def test_replayed_by_idempotency_key_with_the_same_body_refused_with_another(store, task, redis_client, keys):
    texts = ["idem one", "idem two"]
    first, replayed = make(store, task, texts, key="order-17")
    assert not replayed
    again, replayed = make(store, task, texts, key="order-17")
    assert replayed and again.id == first.id
    assert redis_client.llen(keys.bulk(MODEL)) == 2  # queued once
    with pytest.raises(Conflict) as conflict:
        make(store, task, texts[:1], key="order-17")
    assert (conflict.value.status, conflict.value.code) == (422, "idempotency_key_reused")
    with pytest.raises(Conflict):  # the webhook is part of what a retry must repeat
        make(store, task, texts, key="order-17", webhook=HOOK)
    other, replayed = make(store, task, texts, key="order-18")
    assert not replayed and other.id != first.id
    assert store.replay(MODEL, "order-17", first.body_sha256, ANYONE) == first
    assert store.replay(MODEL, "never-used", first.body_sha256, ANYONE) is None
    redis_client.delete(keys.job(first.id))  # its job gone: the key makes a new one
    renewed, replayed = make(store, task, texts, key="order-17")
    assert not replayed and renewed.id not in (first.id, other.id)


def test_an_idempotency_key_is_per_model(store, task, redis_client, keys):
    texts = ["per model"]
    first, _ = make(store, task, texts, key="shared")
    second, replayed = make(store, task, texts, key="shared", model="another-model")
    assert not replayed and second.id != first.id and second.model == "another-model"


def test_a_bad_idempotency_key_is_a_400(store, task):
    for key in ("", "k" * 256):
        with pytest.raises(BadInput) as bad:
            make(store, task, ["text"], key=key)
        assert bad.value.code == "bad_idempotency_key"


def job_records(redis_client, keys) -> int:
    return sum(not k.endswith(b":results") for k in redis_client.keys(keys.job_prefix() + "*"))


class Raced(JobStore):
    """A store whose create sees another submit with the same key commit between its WATCH and
    its EXEC: the interleaving WATCH exists for, made to happen every time."""

    def __init__(self, client, keys, ttl_s, rival: JobStore, rival_job: dict):
        super().__init__(client, keys, ttl_s=ttl_s)
        self.rival, self.rival_job, self.raced = rival, rival_job, False

    def _replay(self, conn, idem, body_sha256, caller):
        found = super()._replay(conn, idem, body_sha256, caller)
        if found is None and not self.raced and conn is not self.client:  # inside create's WATCH
            self.raced = True
            self.rival.create(**self.rival_job)
        return found


def lose_the_race(task, client, rival_client, keys) -> str:
    """A submit whose Idempotency-Key a rival's submit takes while it is under way: it answers the
    winner's job and leaves no record or item of its own. The winner's id."""
    rival = JobStore(rival_client, keys, ttl_s=TTL_S)
    winner_id = jobs.new_job_id()
    payloads = rival.item_payloads(winner_id, MODEL, now_ms(), [(task.preprocess("the winner"), None)])
    raced = Raced(client, keys, TTL_S, rival, dict(
        job_id=winner_id, model=MODEL, created_ms=now_ms(), items=payloads, body_sha256="same",
        idempotency_key="race", caller=ANYONE))
    loser_id = jobs.new_job_id()
    record, replayed = raced.create(loser_id, MODEL, now_ms(), Items([b"loser item"]), "same",
                                    idempotency_key="race", caller=ANYONE)
    assert raced.raced and replayed and record.id == winner_id
    assert not client.exists(keys.job(loser_id)) and client.exists(keys.job(winner_id))
    assert client.lrange(keys.bulk(MODEL), 0, -1) == payloads.payloads  # the winner's item only
    return winner_id


def test_a_submit_that_loses_the_race_for_its_key_answers_the_winners_job(task, redis_server, redis_client, keys):
    lose_the_race(task, redis_client, redis.Redis.from_url(redis_server.url), keys)


def all_at_once(stores, task, texts, key) -> list[tuple[jobs.Record, bool]]:
    """The same submit from each store's thread, released together; every answer."""
    start, answers, errors = threading.Barrier(len(stores)), [], []

    def one(store):
        start.wait()
        try:
            answers.append(make(store, task, texts, key=key))
        except Exception as exc:  # surfaced below: a thread's exception would be lost
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and len(answers) == len(stores)
    return answers


def test_concurrent_submits_with_one_key_make_one_job(task, redis_server, redis_client, keys):
    """Rounds of 8 threads sending the same submit at once, each round with its own key."""
    texts, rounds = ["concurrent one", "concurrent two"], 20
    stores = [JobStore(redis.Redis.from_url(redis_server.url), keys, ttl_s=TTL_S) for _ in range(8)]
    for round_ in range(rounds):
        answers = all_at_once(stores, task, texts, f"together-{round_}")
        assert len({record.id for record, _ in answers}) == 1, round_
        assert sum(not replayed for _, replayed in answers) == 1
    assert redis_client.llen(keys.bulk(MODEL)) == len(texts) * rounds
    assert job_records(redis_client, keys) == rounds


def test_unknown_ids_are_404_and_expired_ones_410(store, task, redis_client, keys):
    for unknown in ("not-a-job", "f" * 32, jobs.new_job_id()):
        with pytest.raises(NotFound) as missing:
            store.load(unknown, ANYONE)
        assert missing.value.code == "unknown_job"
    for old in ("0" * 12 + "f" * 20, jobs.new_job_id(now_ms() - TTL_S * 1000 - 1000)):
        with pytest.raises(Gone) as gone:
            store.load(old, ANYONE)
        assert (gone.value.status, gone.value.code) == (410, "job_expired")
    with pytest.raises(Gone):
        store.cancel("0" * 12 + "f" * 20, ANYONE)
    with pytest.raises(NotFound):
        store.cancel("f" * 32, ANYONE)


def test_a_job_past_its_ttl_is_gone(task, redis_client, keys):
    store = JobStore(redis_client, keys, ttl_s=1)
    record, _ = make(store, task, ["short lived"])
    assert store.load(record.id, ANYONE)[0].state == "queued"
    wait_for(lambda: not redis_client.exists(keys.job(record.id)), timeout_s=5, what="the record expired")
    wait_for(lambda: now_ms() > record.created_ms + 1000, timeout_s=5, what="the job past its TTL")
    with pytest.raises(Gone):
        store.load(record.id, ANYONE)


def test_cancel_stops_a_running_job_but_not_a_finished_one(store, task, redis_client, keys):
    record, _ = make(store, task, ["a", "b", "c"], webhook=HOOK)
    reply_to(redis_client, keys, record.id, 0)
    cancelled = store.cancel(record.id, ANYONE)
    assert (cancelled.state, cancelled.done, cancelled.webhook_state) == ("cancelled", 1, "pending")
    assert redis_client.zscore(keys.webhooks_due(), record.id) is not None
    assert store.load(record.id, ANYONE)[0].state == "cancelled"
    finished, _ = make(store, task, ["d"])
    reply_to(redis_client, keys, finished.id, 0)
    assert store.cancel(finished.id, ANYONE).state == "done"  # every item answered: nothing to cancel


def test_pages_of_results_in_input_order(store, task, redis_client, keys):
    record, _ = make(store, task, [f"page {i}" for i in range(5)])
    reply_to(redis_client, keys, record.id, 0, 2, 4)
    reply_to(redis_client, keys, record.id, 3, ok=False)
    loaded, payloads = store.load(record.id, ANYONE, 1, 10)
    assert (loaded.done, loaded.failed, loaded.state) == (4, 1, "running")
    assert len(payloads) == 4 and payloads[0] is None and payloads[1] and payloads[3]  # items 1..4
    assert store.load(record.id, ANYONE, 5, 10)[1] == [] and store.load(record.id, ANYONE, 0, 0)[1] == []
    pages = list(store.result_pages(loaded, 0, chunk=2))
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [p is not None for page in pages for p in page] == [True, False, True, True, True]
    assert sum(store.result_pages(loaded, 3, chunk=2), []) == payloads[2:]


def test_the_bulk_queue_limit_refuses_a_submit_whole(store, task, redis_client, keys):
    limits = SubmitLimits(max_bulk_queue=4)
    make(store, task, ["one", "two", "three"], limits=limits)
    with pytest.raises(Overloaded) as full:
        make(store, task, ["four", "five"], limits=limits)
    assert full.value.status == 503 and full.value.retry_after == 30
    assert redis_client.llen(keys.bulk(MODEL)) == 3 and job_records(redis_client, keys) == 1


def test_on_a_cluster_a_submit_writes_its_record_apart_and_one_that_loses_or_is_refused_leaves_none(
        task, redis_cluster):
    """On a Redis Cluster the record (the job's slot) is written before the MULTI that queues the
    items and sets the Idempotency-Key (the model's slot): a submit that loses the key's race, or
    whose body conflicts, deletes its record; concurrent submits with one key still make one job."""
    keys = Keys("funnel", cluster=True)
    client = connect(redis_cluster.url, socket_timeout=5)

    def records() -> int:
        return sum(bool(keys.job_of(k.decode())) for k in scan_keys(client, keys.pattern("job")))

    lose_the_race(task, client, connect(redis_cluster.url, socket_timeout=5), keys)
    store = JobStore(client, keys, ttl_s=TTL_S)
    with pytest.raises(Conflict):
        make(store, task, ["another body"], key="race")
    assert records() == 1
    stores = [JobStore(connect(redis_cluster.url, socket_timeout=5), keys, ttl_s=TTL_S) for _ in range(4)]
    for round_ in range(8):
        answers = all_at_once(stores, task, ["together one", "together two"], f"cluster-{round_}")
        assert len({record.id for record, _ in answers}) == 1 and sum(not r for _, r in answers) == 1, round_
    assert records() == 1 + 8 and client.llen(keys.bulk(MODEL)) == 1 + 2 * 8
    loaded, payloads_read = store.load(answers[0][0].id, ANYONE, 0, 5)  # record and results: one slot, one MULTI
    assert loaded.total == 2 and payloads_read == [None, None]
    assert store.cancel(loaded.id, ANYONE).state == "cancelled"


def test_a_job_of_items_all_known_from_the_cache_is_done_as_made_and_its_webhook_due(
        task, redis_client, redis_cluster):
    """Items answered from the cache are stored with the record, never queued: a job of them alone
    is done when it is made, and its webhook due at once (on a cluster, marked apart)."""
    for keys, client in ((Keys(), redis_client), (Keys("funnel", cluster=True),
                                                    connect(redis_cluster.url, socket_timeout=5))):
        store = JobStore(client, keys, ttl_s=TTL_S)
        job_id, queued = jobs.new_job_id(), client.llen(keys.bulk(MODEL))
        known = {i: Reply(id=jobs.item_id(job_id, i), ok=True, outputs={"y": np.full(2, i, np.float32)})
                 for i in range(2)}
        items = store.item_payloads(job_id, MODEL, now_ms(), [(task.preprocess(t), None) for t in ("one", "two")])
        items.known = {i: encode_reply(reply) for i, reply in known.items()}
        record, _ = store.create(job_id, MODEL, now_ms(), items, "sha", {"webhook_url": HOOK}, caller=ANYONE)
        assert record.state == "done" and record.done == record.total == 2 and record.finished_ms
        assert client.llen(keys.bulk(MODEL)) == queued
        loaded, payloads = store.load(job_id, ANYONE, 0, 2)
        assert loaded.webhook_state == "pending" and [decode_reply(p).id for p in payloads] == [
            jobs.item_id(job_id, 0), jobs.item_id(job_id, 1)]
        assert client.zscore(keys.webhooks_due(), job_id) is not None


# -- ownership: a job is its submitter's (docs/jobs.md, "Ownership") -----------------------------

ALICE = jobs.Caller(owner="a" * 64, label="alice")
BOB = jobs.Caller(owner="b" * 64, label="bob")
OPS = jobs.Caller(owner="c" * 64, label="ops", admin=True)


def refusal(call) -> tuple[type, int, str, str]:
    """What a call raised: its class, status, code and message."""
    with pytest.raises((NotFound, Gone)) as refused:
        call()
    return type(refused.value), refused.value.status, refused.value.code, refused.value.message


def test_a_job_records_its_owner_and_is_read_only_by_it_or_an_admin(store, task, redis_client, keys):
    record, _ = make(store, task, ["mine", "all mine"], caller=ALICE)
    raw = redis_client.hgetall(keys.job(record.id))
    assert (raw[b"owner"], raw[b"owner_label"]) == (ALICE.owner.encode(), b"alice")
    assert "owner" not in str(record.status()) and ALICE.owner not in str(record.status())
    assert store.load(record.id, ALICE)[0] == record and store.load(record.id, OPS)[0] == record
    never = jobs.new_job_id()
    mine, theirs = refusal(lambda: store.load(record.id, BOB, 0, 10)), refusal(lambda: store.load(never, BOB, 0, 10))
    assert mine == (NotFound, 404, "unknown_job", f"no job {record.id!r}")
    assert mine[:3] == theirs[:3] and theirs[3] == f"no job {never!r}"  # the same answer, the id aside
    assert refusal(lambda: store.cancel(record.id, BOB))[:3] == (NotFound, 404, "unknown_job")
    assert redis_client.hget(keys.job(record.id), "state") == b"active"  # bob's cancel left it be
    assert ANYONE.may_see(record)  # a server with no API keys: anyone, as before
    assert store.cancel(record.id, OPS).state == "cancelled"


def test_another_callers_job_past_its_creation_ttl_reads_as_a_missing_id_of_that_age(task, redis_client, keys):
    """A job kept alive by progress past created + TTL: to another caller, exactly what a made-up id of
    that age gets (410), never a 404 that would tell it exists."""
    store = JobStore(redis_client, keys, ttl_s=1)
    record, _ = make(store, task, ["old but alive"], caller=ALICE)
    redis_client.pexpire(keys.job(record.id), 60_000)  # as an answered item pushes the TTL on
    wait_for(lambda: now_ms() > record.created_ms + 1000, timeout_s=5, what="the job past its creation TTL")
    assert store.load(record.id, ALICE)[0].id == record.id
    made_up = jobs.new_job_id(record.created_ms)
    assert refusal(lambda: store.load(record.id, BOB))[:3] == refusal(lambda: store.load(made_up, BOB))[:3] \
        == (Gone, 410, "job_expired")


def test_idempotency_keys_are_each_callers_own(store, task, redis_client, keys):
    texts = ["scoped one", "scoped two"]
    first, _ = make(store, task, texts, key="order-17", caller=ALICE)
    bobs, replayed = make(store, task, texts, key="order-17", caller=BOB)  # alice's key, the same body
    assert not replayed and bobs.id != first.id and bobs.owner == BOB.owner
    other, replayed = make(store, task, texts[:1], key="order-18", caller=BOB)
    admins, replayed = make(store, task, texts[:1], key="order-18", caller=OPS)  # another body: not a 422
    assert not replayed and admins.id not in (first.id, bobs.id, other.id)
    with pytest.raises(Conflict):  # alice's own key with another body
        make(store, task, texts[:1], key="order-17", caller=ALICE)
    with pytest.raises(Conflict):  # and bob's
        make(store, task, texts[:1], key="order-17", caller=BOB)
    assert make(store, task, texts, key="order-17", caller=ALICE) == (first, True)
    assert make(store, task, texts, key="order-17", caller=BOB) == (bobs, True)
    assert store.replay(MODEL, "order-17", bobs.body_sha256, BOB) == bobs
    assert redis_client.llen(keys.bulk(MODEL)) == 2 + 2 + 1 + 1  # four jobs, each queued once
    assert not any(b"order-1" in name for name in redis_client.keys("*"))  # hashed, never the key itself


def test_without_api_keys_the_idempotency_key_is_named_as_before(store, keys):
    """A server with no API keys keeps the Redis name it always gave a key (an upgrade replays as before)."""
    import hashlib

    assert store._idempotency(MODEL, "order-17", ANYONE) == keys.idempotency(
        MODEL, hashlib.sha256(b"order-17").hexdigest()[:48])
    assert store._idempotency(MODEL, "order-17", ALICE) != store._idempotency(MODEL, "order-17", BOB)


def test_with_job_replicas_a_job_is_accepted_only_once_a_replica_holds_it(task, sentinels):
    """Behind Sentinel, FUNNEL_JOB_REPLICAS=1: the 202 waits for the replica (WAIT), so a failover
    right after it cannot lose the job; with the replica gone, the submit is refused and undone."""
    from funnel.common.errors import Unavailable

    keys = Keys()
    store = JobStore(connect(sentinels.url, socket_timeout=5), keys, ttl_s=TTL_S, replicas=1)
    replica = redis.Redis(port=sentinels.replica.port)
    job_id = jobs.new_job_id()
    payloads = store.item_payloads(job_id, MODEL, now_ms(), [(task.preprocess("kept"), None)])
    store.create(job_id, MODEL, now_ms(), payloads, "sha", idempotency_key="kept", caller=ANYONE)
    assert replica.exists(keys.job(job_id)) and replica.llen(keys.bulk(MODEL)) == 1  # there at the 202
    sentinels.replica.stop()
    refused = jobs.new_job_id()
    started = time.monotonic()
    with pytest.raises(Unavailable) as raised:
        store.create(refused, MODEL, now_ms(), payloads, "sha2", idempotency_key="refused", caller=ANYONE)
    assert raised.value.code == "not_replicated" and time.monotonic() - started < 5
    primary = redis.Redis(port=sentinels.primary.port)
    assert not primary.exists(keys.job(refused))  # undone: its queued item is dropped as a job that never was
    assert store.replay(MODEL, "refused", "sha2", ANYONE) is None  # a retry with the key makes it anew


def test_a_submit_whose_answer_is_lost_queues_its_items_once(task, redis_server, keys):
    """The EXEC ran and its answer was lost: the client's retry must not queue the items again
    (redis-py sends a transaction again unless it watches keys)."""
    proxy = CuttingProxy(redis_server.port)
    client = connect(f"redis://127.0.0.1:{proxy.port}", socket_timeout=3)
    direct = redis.Redis(port=redis_server.port)
    direct.flushall()
    try:
        store = JobStore(client, keys, ttl_s=TTL_S)
        proxy.arm(after=b"EXEC")
        record, replayed = make(store, task, ["one", "two", "three"])
        assert proxy.cuts == 1 and not replayed
        assert direct.llen(keys.bulk(MODEL, 1)) == 3
        assert direct.hget(keys.job(record.id), "total") == b"3"
        proxy.arm(after=b"EXEC")  # with an Idempotency-Key too
        again, replayed = make(store, task, ["four"], key="lost-answer")
        assert proxy.cuts == 2 and not replayed and direct.llen(keys.bulk(MODEL, 1)) == 4
        assert make(store, task, ["four"], key="lost-answer") == (again, True)
    finally:
        client.close()
        proxy.close()
