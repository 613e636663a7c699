"""The web tier's side of the queue: push jobs, wait for their replies.

Replies come back through this process's shared inbox (web/inbox.py, the
default) or, with inbox=None (FUNNEL_REPLY_INBOX=0), through one BLPOP per
request on a reply key of its own; README, Performance, compares the two.

Before pushing, the push script predicts when the request would be answered
(web/shedding.py) and turns it away at once, 503 with Retry-After, when that
is past its deadline: still one round trip per request.
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
from funnel.web.outbox import Outbox
from funnel.web.shedding import NO_WORKER_RETRY_AFTER_S, Calibration, Capacity, WorkerView, retry_after_s

# In one step, so concurrent requests cannot overfill the queue: LPUSH the jobs
# (ARGV[10:]) unless the queue KEYS[1] is ARGV[1] long already (0: no limit;
# returns {0, length}) or, with an estimate (ARGV[2] = 1), the jobs queued and
# held in the workers' in-flight lists (KEYS[2:]) predict an answer later than
# the budget ARGV[3] seconds (returns {-1, jobs ahead}; web/shedding.py's
# Capacity.wait_s, same formula). Pushed: {1, new length, jobs ahead (-1: not estimated)}.
_PUSH_BOUNDED = """
local limit = tonumber(ARGV[1])
local queued = redis.call('LLEN', KEYS[1])
if limit > 0 and queued >= limit then return {0, queued} end
local ahead = -1
if ARGV[2] == '1' then
  ahead = queued
  for i = 2, #KEYS do ahead = ahead + redis.call('LLEN', KEYS[i]) end
  local rate, item_s, batch_s, size = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local n = #ARGV - 9
  local k = math.min(size, ahead + n)
  local wait = math.max((ahead + n) / rate, item_s * k + batch_s) * tonumber(ARGV[8]) + tonumber(ARGV[9])
  if wait > tonumber(ARGV[3]) then return {-1, ahead} end
end
return {1, redis.call('LPUSH', KEYS[1], unpack(ARGV, 10)), ahead}
"""


class Gateway:
    def __init__(self, client: redis.Redis, keys: Keys, max_queue: int = 0, inbox: Inbox | None = None,
                 shed: bool = True, hold_without_workers: bool = False, outbox: bool = False):
        self.client, self.keys, self.max_queue, self.inbox = client, keys, max_queue, inbox
        self.shed, self.hold_without_workers = shed, hold_without_workers
        self.workers = WorkerView(client, keys)
        self.calibration = Calibration()
        self._push = client.register_script(_PUSH_BOUNDED)
        self.outbox = Outbox(client, self._push) if outbox else None

    def submit(self, model: str, inputs: list[dict[str, np.ndarray]], timeout_s: float,
               raw: bool = False) -> list[Reply]:
        """Queue one job per input and return their replies, in input order.

        raw: the replies carry the model's output rows instead of the task's results.
        503 at once when no live worker serves the model (unless held), when the
        queue is at FUNNEL_MAX_QUEUE, or when the predicted wait is past timeout_s.
        """
        deadline = now_ms() + int(timeout_s * 1000)
        try:
            capacity = self._capacity(model)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        ids = [uuid.uuid4().hex for _ in inputs]
        inbox = self.inbox
        waiter = inbox.expect(model, ids) if inbox else None
        # Reply lists in the model's slot, with its queue and in-flight lists (common/keys.py).
        reply_to = [inbox.key(model)] * len(ids) if inbox else [self.keys.reply(model, i) for i in ids]
        jobs = [Job(id=job_id, model=model, inputs=item, reply_to=to, deadline=deadline, raw=raw)
                for job_id, item, to in zip(ids, inputs, reply_to)]
        estimate = self.shed and capacity.known
        calibration = self.calibration.factor(model)
        keys = [self.keys.queue(model), *(self.keys.inflight(model, w) for w in capacity.workers if estimate)]
        args: list[bytes | str | int | float] = [self.max_queue, int(estimate), timeout_s,
                                                 *capacity.script_args(calibration), *map(encode_job, jobs)]
        try:
            outcome, count, *ahead = (self.outbox.push(keys, args, timeout_s) if self.outbox
                                      else self._push(keys=keys, args=args))
            if outcome == 0:
                raise Overloaded(f"the {model} queue is full ({count} jobs); retry shortly",
                                 retry_after=retry_after_s(capacity.wait_s(count, 0, calibration))
                                 if capacity.known else 1)
            if outcome < 0:
                wait_s = capacity.wait_s(count, len(jobs), calibration)
                raise Overloaded(f"the {model} queue would answer in about {wait_s:.1f} s, past this "
                                 f"request's deadline of {timeout_s:g} s; retry later",
                                 retry_after=retry_after_s(wait_s))
            pushed_ms = now_ms()
            try:
                if inbox and waiter is not None:
                    return inbox.collect(waiter, ids, deadline)
                return self._await(jobs, deadline)
            finally:  # answered or timed out: either way, how late against the prediction
                if ahead and ahead[0] >= 0:
                    self.calibration.observe(model, capacity.wait_s(ahead[0], len(jobs)),
                                             (now_ms() - pushed_ms) / 1000)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        finally:
            if inbox:
                inbox.forget(ids)

    def _capacity(self, model: str) -> Capacity:
        """The model's live workers (cached per process); 503 at once when it has none, unless held."""
        if not self.shed and self.hold_without_workers:
            return Capacity(())  # nothing to predict with, nothing to refuse: no registry read
        capacity = self.workers.capacity(model)
        if not capacity.workers and not self.hold_without_workers and not self.workers.recently_served(model):
            raise Unavailable(f"no live worker serves {model}; retry when one has started",
                              code="no_worker", retry_after=NO_WORKER_RETRY_AFTER_S)
        return capacity

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
