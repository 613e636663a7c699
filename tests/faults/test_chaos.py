"""A short round of the chaos soak (python -m benchmarks.chaos): every fault at once, one ledger.

Redis behind Sentinel, two web tiers behind nginx, two workers per model; 50 s of mixed traffic
(/v1 texts and images, /v2, bulk jobs, clients that hang up) while a worker is killed and one
paused past its heartbeat, a web tier killed, the Redis primary killed and nginx restarted, each
at a seeded moment. Then the soak's checks (benchmarks/chaos.py, Result.checks) must hold, with
the one allowance the failure contract makes, a primary kill's replication window (see the asserts).
A failed check names each job it is about, with what the ledger and the processes' logs say of it.
"""

import collections

import pytest

from benchmarks import chaos
from funnel.scripts.front_door import nginx_binary
from tests.support import Outcome

DURATION_S = 50.0
SEED = 7
CLIENTS = 4
CLEAR = {200, 503, 504}  # what a client may be answered while tiers die: 503 from nginx, 503/504 the web's


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed")
def test_chaos_round(model_store, tmp_path, report):
    result = chaos.soak(model_store, DURATION_S, SEED, clients=CLIENTS, bulk_clients=1, workers_per_model=2,
                        log_dir=tmp_path)
    print("\n" + chaos.report(result, "tests/faults/test_chaos.py", 0.0))
    outcome = Outcome()
    for r in result.requests:
        if r.outcome != "hung_up":
            outcome.add(r.status, r.seconds, r.status != 200 or bool(r.correct))
    report(outcome, len(result.ledger.answered_twice))
    checks = {name: (held, figures) for name, held, figures in result.checks()}
    logs = f"logs: {tmp_path}"

    # Every fault was injected, each kind at least once, and the traffic really flowed.
    assert checks["every event injected"][0], checks["every event injected"]
    assert set(collections.Counter(e.kind for e in result.events if e.started)) == set(chaos.KINDS)
    assert outcome.ok > 300, (outcome, logs)
    assert sum(r.outcome == "hung_up" for r in result.requests) > 10
    # Every request that waited got a clear status in time, and each 200 was its own input's answer.
    statuses = collections.Counter(r.status for r in result.requests if r.outcome != "hung_up")
    assert set(statuses) <= CLEAR, (statuses, logs)
    assert checks["every request sent answered (but those hung up)"][0], checks
    # Nor refused: nginx restarts on the socket it had, whose queued connections the new one accepts.
    assert checks["no connection refused"][0], checks
    assert checks["none answered past its deadline + 1 s"][0], checks
    assert checks["no answer to the wrong request"][0], checks
    # No job Redis acknowledged was lost, but in a primary kill's replication window (asynchronous
    # replication: the failure contract's caveat), at most one per client there.
    assert all(result.cause(j) == "redis-kill" for j in result.lost), (checks["no acknowledged job lost"],
                                                                        result.evidence(result.lost), logs)
    assert len(result.lost) <= CLIENTS
    # None answered twice, but in that same window (the reply script forgets a job and answers it in
    # one step, so a worker paused past its heartbeat, whose jobs a peer ran, answers none of them).
    assert not result.unexplained_twice(), (checks["none answered twice"], result.evidence(
        result.unexplained_twice()), logs)
    # Bulk jobs: each acknowledged one done, every result there and right (a second answer, of a
    # paused worker, is stored once: above).
    assert result.acknowledged_jobs and not result.incomplete_jobs, (checks["bulk jobs complete, every result once"],
                                                                      logs)
    assert not sum(j.wrong for j in result.jobs)
    # Afterwards: no key without a TTL left behind, every worker listed alive, memory back near its level.
    assert checks["Redis keys without a TTL back to their count"][0], checks
    assert checks["each long-lived process's memory back near its baseline"][0], checks
