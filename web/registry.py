"""What Redis says about the workers and queues: read by /v1/models, /readyz and /metrics."""

from __future__ import annotations

import redis

from common.keys import Keys


def live_workers(client: redis.Redis, keys: Keys) -> list[dict]:
    """Every worker whose heartbeat key has not expired, as a dict of its hash fields.

    Raises redis.RedisError when Redis is unreachable: callers answer 503.
    """
    ids = sorted(i.decode() for i in client.hkeys(keys.workers()))
    pipe = client.pipeline(transaction=False)
    for worker_id in ids:
        pipe.hgetall(keys.worker(worker_id))
    found = pipe.execute()
    return [{"id": worker_id, **{k.decode(): v.decode() for k, v in info.items()}}
            for worker_id, info in zip(ids, found) if info]


def queue_lengths(client: redis.Redis, keys: Keys, models: list[str]) -> dict[str, int]:
    pipe = client.pipeline(transaction=False)
    for model in models:
        pipe.llen(keys.queue(model))
    return dict(zip(models, pipe.execute()))


def describe(spec, workers: list[dict], queue_length: int) -> dict:
    """One model as GET /v1/models shows it: its settings, queue and live workers."""
    return {**spec.public(), "queue": queue_length,
            "workers": [w for w in workers if w.get("model") == spec.name]}
