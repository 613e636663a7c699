"""The web tier's side of the queue: push jobs, wait for their replies."""

from __future__ import annotations

import math
import uuid

import numpy as np
import redis

from common.errors import Overloaded, Timeout, Unavailable
from common.keys import Keys
from common.wire import Job, Reply, decode_reply, encode_job, now_ms


# LPUSH the jobs only if the queue is shorter than ARGV[1] (0: no limit), in
# one step, so concurrent requests cannot overfill it. Returns -1 when full.
_PUSH_BOUNDED = """
local limit = tonumber(ARGV[1])
if limit > 0 and redis.call('LLEN', KEYS[1]) >= limit then return -1 end
return redis.call('LPUSH', KEYS[1], unpack(ARGV, 2))
"""


class Gateway:
    def __init__(self, client: redis.Redis, keys: Keys, max_queue: int = 0):
        self.client, self.keys, self.max_queue = client, keys, max_queue
        self._push = client.register_script(_PUSH_BOUNDED)

    def submit(self, model: str, inputs: list[dict[str, np.ndarray]], timeout_s: float) -> list[Reply]:
        """Queue one job per input and return their replies, in input order."""
        deadline = now_ms() + int(timeout_s * 1000)
        jobs = []
        for item in inputs:
            job_id = uuid.uuid4().hex
            jobs.append(Job(id=job_id, model=model, inputs=item,
                            reply_to=self.keys.reply(job_id), deadline=deadline))
        queue = self.keys.queue(model)
        try:
            if self._push(keys=[queue], args=[self.max_queue, *map(encode_job, jobs)]) < 0:
                raise Overloaded(f"the {model} queue is full; retry shortly")
            return self._await(jobs, deadline)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None

    def _await(self, jobs: list[Job], deadline: int) -> list[Reply]:
        pending = {job.reply_to: i for i, job in enumerate(jobs)}
        replies: list[Reply | None] = [None] * len(jobs)
        while pending:
            remaining_s = (deadline - now_ms()) / 1000
            if remaining_s <= 0:
                raise Timeout("no reply before the deadline")
            # BLPOP's timeout 0 means forever: never round down to it.
            got = self.client.blpop(list(pending), timeout=max(0.01, math.ceil(remaining_s * 100) / 100))
            if got is None:
                raise Timeout("no reply before the deadline")
            key, data = got
            replies[pending.pop(key.decode())] = decode_reply(data)
        return replies  # type: ignore[return-value]
