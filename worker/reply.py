"""Answering a batch: every reply, dead letter and the in-flight clear in one transaction.

Every key of that MULTI carries the model's hash tag (the worker checks each
job's reply_to against its model, worker/batch.py), so on Redis Cluster it
stays in one slot; bulk items' results are stored in it only off a cluster.
"""

from __future__ import annotations

import redis

from funnel.common.jobs import store_results
from funnel.common.keys import Keys
from funnel.common.wire import Reply, encode_reply


def answer(client: redis.Redis, keys: Keys, worker_id: str, model: str,
           replies: list[tuple[str, Reply]], dead: list[bytes], ttl_s: int) -> None:
    """LPUSH + EXPIRE the replies, one push per reply list, park dead jobs, then forget the batch.

    MULTI/EXEC makes it all or nothing: a crash before EXEC leaves the jobs in
    flight for recovery, a crash after leaves nothing half done.
    """
    by_list: dict[str, list[bytes]] = {}
    by_job: dict[str, list[Reply]] = {}  # items of async and bulk jobs: stored by index, not pushed
    for reply_to, reply in replies:
        if keys.job_of_results(reply_to):
            by_job.setdefault(reply_to, []).append(reply)
        else:
            by_list.setdefault(reply_to, []).append(encode_reply(reply))
    pipe = client.pipeline(transaction=True)
    for results_key, items in by_job.items():
        store_results(pipe, keys, results_key, items)
    for reply_to, payloads in by_list.items():  # a web process's inbox takes its share in one push
        pipe.lpush(reply_to, *payloads)
        pipe.expire(reply_to, ttl_s)
    for raw in dead:
        pipe.lpush(keys.dead(model), raw)
    pipe.delete(keys.inflight(model, worker_id))
    pipe.execute()
