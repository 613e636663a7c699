"""Answering a batch: every reply, dead letter and the in-flight clear in one transaction."""

from __future__ import annotations

import redis

from common.keys import Keys
from common.wire import Reply, encode_reply


def answer(client: redis.Redis, keys: Keys, worker_id: str, model: str,
           replies: list[tuple[str, Reply]], dead: list[bytes], ttl_s: int) -> None:
    """LPUSH + EXPIRE each reply, park dead jobs, then forget the batch.

    MULTI/EXEC makes it all or nothing: a crash before EXEC leaves the jobs in
    flight for recovery, a crash after leaves nothing half done.
    """
    pipe = client.pipeline(transaction=True)
    for reply_to, reply in replies:
        pipe.lpush(reply_to, encode_reply(reply))
        pipe.expire(reply_to, ttl_s)
    for raw in dead:
        pipe.lpush(keys.dead(model), raw)
    pipe.delete(keys.inflight(worker_id))
    pipe.execute()
