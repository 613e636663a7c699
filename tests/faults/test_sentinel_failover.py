"""Redis Sentinel: the primary SIGKILLed under load; web and worker follow the failover, no restart.

The scenario is benchmarks/failover.py's (one round of `python -m benchmarks.failover`), so
the figures printed here (pytest -s) are the ones docs/redis.md quotes.
"""

from benchmarks import failover
from tests.support import Outcome, cached_store

CLIENTS, PATIENT = 6, 2  # clients that resend at once; clients through funnel_client, which waits as told
AFTER_S = 12.0
RECOVERED_WITHIN_S = 8.0  # Sentinel's own part is down-after-milliseconds (1 s) plus the election


def test_primary_killed_under_load(model_store, tmp_path, sentinels, expected_embeddings, report):
    round_ = failover.run(model_store, tmp_path, clients=CLIENTS, before=30, after_s=AFTER_S, sentinels=sentinels,
                          patient=PATIENT)
    failover.check_answers(round_, expected_embeddings)
    print(f"\nSentinel failover: {failover.summary(round_)}")
    outcome = Outcome()
    for r in round_.requests + round_.patient:
        outcome.add(r.status, r.seconds)
    outcome.wrong = round_.wrong
    report(outcome, len(round_.answered_twice))
    followed(round_)
    # Asynchronous replication may lose the jobs pushed in the last instant before the kill, at most
    # the one each client had in flight; none may be answered twice.
    assert len(round_.queued) >= sum(r.status == 200 for r in round_.requests + round_.patient)
    assert len(round_.lost) <= CLIENTS + PATIENT, round_.lost
    assert not round_.answered_twice, round_.answered_twice


def followed(round_: failover.Round) -> None:
    """What every failover round holds to: answers in time, right, and service back soon."""
    # No request hangs: each got 200, 503 or 504 within its deadline (10 s) and a little more.
    assert set(round_.statuses) <= {200, 503, 504}, round_.statuses
    assert round_.slowest_s < failover.REQUEST_TIMEOUT_S + 2, round_.slowest_s
    # Nothing failed before the kill, and every request succeeded again soon after it ...
    assert all(r.ended >= round_.killed_at for r in round_.failures)
    assert round_.recovered_s is not None and round_.recovered_s < RECOVERED_WITHIN_S, failover.summary(round_)
    # ... and went on succeeding: several seconds of nothing but 200s before the load stopped.
    steady = [r for r in round_.requests if r.started > round_.killed_at + round_.recovered_s]
    assert len(steady) > 50 and all(r.status == 200 for r in steady)
    assert round_.wrong == 0
    # The Python client retries a 503 after its Retry-After; its calls too end, each with an answer.
    assert round_.patient and set(round_.patient_statuses) <= {200, 503}, round_.patient_statuses
    assert round_.patient_slowest_s < failover.REQUEST_TIMEOUT_S, round_.patient_slowest_s


SHARED = 20  # sentences the clients share with the cache on, every other one: hits and identical items in flight


def test_primary_killed_under_load_with_the_result_cache(model_store, tmp_path, sentinels, expected_embeddings):
    """The cache's failover row: entries and pending markers lost with the old primary are misses,
    a request waiting on another's job whose marker was lost asks again by that job's deadline;
    every other sentence is one of 20 the clients share, the others new, so hits, misses and
    coalesced items run through the kill. Every
    answer is 200, 503 or 504 in time and right, service comes back, and nothing is answered twice."""
    store = cached_store(model_store, tmp_path)
    round_ = failover.run(store, tmp_path, clients=CLIENTS, before=30, after_s=AFTER_S, sentinels=sentinels,
                          patient=PATIENT, shared=SHARED)
    failover.check_answers(round_, expected_embeddings)
    print(f"\nSentinel failover, cache on: {failover.summary(round_)}")
    followed(round_)
    # Hits queue no job: fewer jobs than answers; none answered twice.
    assert len(round_.queued) < sum(r.status == 200 for r in round_.requests), "the cache answered nothing"
    assert not round_.answered_twice, round_.answered_twice
