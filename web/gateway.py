"""The web tier's side of the queue: push jobs, wait for their replies.

Replies come back through this process's shared inbox (web/inbox.py, the
default) or, with inbox=None (FUNNEL_REPLY_INBOX=0), through one BLPOP per
request on a reply key of its own; README, Performance, compares the two.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import redis

from funnel.common.errors import Overloaded, Timeout, Unavailable
from funnel.common.keys import Keys
from funnel.common.wire import Job, Reply, decode_reply, encode_job, now_ms
from funnel.web.inbox import Inbox

# LPUSH the jobs only if the queue is shorter than ARGV[1] (0: no limit), in
# one step, so concurrent requests cannot overfill it. Returns -1 when full.
_PUSH_BOUNDED = """
local limit = tonumber(ARGV[1])
if limit > 0 and redis.call('LLEN', KEYS[1]) >= limit then return -1 end
return redis.call('LPUSH', KEYS[1], unpack(ARGV, 2))
"""


class Gateway:
    def __init__(self, client: redis.Redis, keys: Keys, max_queue: int = 0, inbox: Inbox | None = None):
        self.client, self.keys, self.max_queue, self.inbox = client, keys, max_queue, inbox
        self._push = client.register_script(_PUSH_BOUNDED)

    def submit(self, model: str, inputs: list[dict[str, np.ndarray]], timeout_s: float) -> list[Reply]:
        """Queue one job per input and return their replies, in input order."""
        deadline = now_ms() + int(timeout_s * 1000)
        ids = [uuid.uuid4().hex for _ in inputs]
        inbox = self.inbox
        waiter = inbox.expect(ids) if inbox else None
        reply_to = [inbox.key] * len(ids) if inbox else [self.keys.reply(i) for i in ids]
        jobs = [Job(id=job_id, model=model, inputs=item, reply_to=to, deadline=deadline)
                for job_id, item, to in zip(ids, inputs, reply_to)]
        try:
            if self._push(keys=[self.keys.queue(model)], args=[self.max_queue, *map(encode_job, jobs)]) < 0:
                raise Overloaded(f"the {model} queue is full; retry shortly")
            if inbox and waiter is not None:
                return inbox.collect(waiter, ids, deadline)
            return self._await(jobs, deadline)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        finally:
            if inbox:
                inbox.forget(ids)

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
            replies[pending.pop(key.decode() if isinstance(key, bytes) else key)] = decode_reply(data)
        return replies  # type: ignore[return-value]
