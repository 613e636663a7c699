"""The web tier's side of the queue: push jobs, wait for their replies.

Replies come back through this process's shared inbox (web/inbox.py, the
default) or, with inbox=None (FUNNEL_REPLY_INBOX=0), through one BLPOP per
request on a reply key of its own; README, Performance, compares the two.

Before pushing, the push script predicts when the request would be answered
(web/shedding.py) and turns it away at once, 503 with Retry-After, when that
is past its deadline: still one round trip per request.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from funnel.common.errors import Overloaded, Timeout, Unavailable
from funnel.common.keys import Keys
from funnel.common.wire import Job, Reply, decode_reply, encode_job, now_ms
from funnel.web.inbox import Inbox, LoopWaiter
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


@dataclass
class _Plan:
    """One request's jobs on their way: what submit() and submit_async() share."""

    model: str
    timeout_s: float
    ids: list[str]
    jobs: list[Job]
    deadline: int
    capacity: Capacity
    calibration: float
    keys: list[str]
    args: list[bytes | str | int | float]
    waiter: Any
    pushed_ms: int = 0
    ahead: int = -1  # jobs ahead of it when pushed, as the script counted them (-1: not estimated)


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
        plan = self._plan(model, inputs, timeout_s, raw, self.inbox.expect if self.inbox else None)
        with self._queued(plan):
            self._accepted(plan, self.outbox.push(plan.keys, plan.args, timeout_s) if self.outbox
                           else self._push(keys=plan.keys, args=plan.args))
            if self.inbox and plan.waiter is not None:
                return self.inbox.collect(plan.waiter, plan.ids, plan.deadline)
            return self._await(plan.jobs, plan.deadline)

    async def submit_async(self, model: str, inputs: list[dict[str, np.ndarray]], timeout_s: float) -> list[Reply]:
        """submit() for a request on the event loop (web/asgi.py): the same steps, awaited.

        The push goes out with the other pushes of the loop's tick (Outbox.push_async) and
        the replies come through the inbox; both are required (the ASGI front sets them up).
        """
        inbox, outbox = self.inbox, self.outbox
        assert inbox is not None and outbox is not None, "the event loop's predict needs the inbox and outbox"
        plan = self._plan(model, inputs, timeout_s, False, lambda m, ids: inbox.expect(m, ids, LoopWaiter(len(ids))))
        with self._queued(plan):
            self._accepted(plan, await outbox.push_async(plan.keys, plan.args))
            return await inbox.collect_async(plan.waiter, plan.ids, plan.deadline)

    def _plan(self, model: str, inputs: list[dict[str, np.ndarray]], timeout_s: float, raw: bool,
              expect: Callable[[str, list[str]], Any] | None) -> _Plan:
        """The jobs and the push script's keys and arguments; their replies expected before they go."""
        deadline = now_ms() + int(timeout_s * 1000)
        try:
            capacity = self._capacity(model)
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        ids = [os.urandom(16).hex() for _ in inputs]  # uuid4's randomness, a third of its CPU
        inbox = self.inbox
        waiter = expect(model, ids) if expect else None
        # Reply lists in the model's slot, with its queue and in-flight lists (common/keys.py).
        reply_to = [inbox.key(model)] * len(ids) if inbox else [self.keys.reply(model, i) for i in ids]
        jobs = [Job(id=job_id, model=model, inputs=item, reply_to=to, deadline=deadline, raw=raw)
                for job_id, item, to in zip(ids, inputs, reply_to)]
        estimate = self.shed and capacity.known
        calibration = self.calibration.factor(model)
        keys = [self.keys.queue(model), *(self.keys.inflight(model, w) for w in capacity.workers if estimate)]
        args: list[bytes | str | int | float] = [self.max_queue, int(estimate), timeout_s,
                                                 *capacity.script_args(calibration), *map(encode_job, jobs)]
        return _Plan(model, timeout_s, ids, jobs, deadline, capacity, calibration, keys, args, waiter)

    @contextlib.contextmanager
    def _queued(self, plan: _Plan):
        """Around a request's push and wait: a Redis error is a 503, and its replies are no longer
        expected once it leaves; an accepted push's answer (or timeout) calibrates the shedder."""
        try:
            yield
        except redis.RedisError as exc:
            raise Unavailable(f"queue unavailable: {type(exc).__name__}") from None
        finally:
            if plan.ahead >= 0:  # answered or timed out: either way, how late against the prediction
                self.calibration.observe(plan.model, plan.capacity.wait_s(plan.ahead, len(plan.jobs)),
                                         (now_ms() - plan.pushed_ms) / 1000)
            if self.inbox:
                self.inbox.forget(plan.ids)

    def _accepted(self, plan: _Plan, pushed: list) -> None:
        """The push script's answer: 503 if it turned the request away; else the jobs ahead of it."""
        outcome, count, *ahead = pushed
        capacity, calibration = plan.capacity, plan.calibration
        if outcome == 0:
            raise Overloaded(f"the {plan.model} queue is full ({count} jobs); retry shortly",
                             retry_after=retry_after_s(capacity.wait_s(count, 0, calibration))
                             if capacity.known else 1)
        if outcome < 0:
            wait_s = capacity.wait_s(count, len(plan.jobs), calibration)
            raise Overloaded(f"the {plan.model} queue would answer in about {wait_s:.1f} s, past this "
                             f"request's deadline of {plan.timeout_s:g} s; retry later",
                             retry_after=retry_after_s(wait_s))
        plan.pushed_ms = now_ms()
        plan.ahead = ahead[0] if ahead else -1

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
