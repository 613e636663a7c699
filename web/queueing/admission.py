"""Admission: whether a request is served now, and in which lane.

Before the push (no round trip: the process's view of the workers, queueing/shedding.py):

- no live worker serves the model version: 503 `no_worker` at once, unless requests are held
  for one (FUNNEL_HOLD_WITHOUT_WORKERS) or Redis has just lost its data (WorkerView.grace_s);
  every one of them failed to load it (worker/residency.py): 503 `model_unavailable`, naming why;
- the lane: the one asked for, at most the API key's highest (queueing/limits.py), and normal
  while a worker from before the lanes serves the version (it takes the normal queue only).

In the push script's round trip (common/link/lua/push.lua), its answer's first element, a
Verdict: the key past its rate or its cap on requests under way (429), the queue at its limit
or the predicted wait past the deadline (503 `overloaded`), else pushed. A request admitted in
the grace waits that long at most for a worker to come (web/pipeline.py, _await_a_worker).
"""

from __future__ import annotations

import enum

import redis

from funnel.common.contracts import priority
from funnel.common.errors import ModelUnavailable, NoWorker, Overloaded, TooManyRequests, queue_unavailable
from funnel.web.queueing import limits
from funnel.web.queueing.shedding import Capacity, WorkerView, retry_after_s
from funnel.web.settings import WebSettings


class Verdict(enum.IntEnum):
    """push.lua's answer, {verdict, count, ...} (its header says what count is for each)."""

    PUSHED = 1  # count: the queue's new length
    QUEUE_FULL = 0  # count: the items queued in the request's lane and above
    TOO_LATE = -1  # count: the items ahead of it; the predicted wait is past the budget
    PAST_RATE = -2  # count: ms until the key has a token
    AT_CAP = -3  # count: ms until the key's earliest request under way is past its deadline
    NOT_KNOWN = -4  # count: the cached items not known, where no live worker would compute them


class Admission:
    def __init__(self, workers: WorkerView, settings: WebSettings):
        self.workers, self.settings = workers, settings
        self.key_limits = limits.parse(settings.key_limits)

    def capacity(self, model: str, version: int) -> Capacity:
        """The model version's live workers (this process's view); 503 `no_worker` when it has none,
        unless held."""
        settings = self.settings
        if not settings.shed and settings.hold_without_workers:
            return Capacity(())  # nothing to predict with, nothing to refuse: no registry read
        try:
            capacity = self.workers.capacity(model, version)
        except redis.RedisError as exc:
            raise queue_unavailable(exc) from None
        if not capacity.workers and not settings.hold_without_workers and not self.workers.grace_s(model, version):
            raise NoWorker(model, version)
        if capacity.unavailable:
            raise ModelUnavailable(model, version, capacity.unavailable)
        return capacity

    def lane(self, asked: str, label: str, limited: bool, model: str, version: int) -> str:
        """The lane a request is served in: the one asked for, at most its API key's highest (label:
        which limits apply, limited: the server has keys); normal while a worker from before the
        lanes serves the model version."""
        lane = priority.at_most(asked, limits.highest_lane(self.key_limits, label)) if limited else asked
        if lane != priority.NORMAL:
            try:
                if not self.workers.capacity(model, version).lanes:
                    return priority.NORMAL
            except redis.RedisError as exc:
                raise queue_unavailable(exc) from None
        return lane

    def limit(self, label: str, limited: bool) -> limits.Limit | None:
        """The limits of the request's API key; None where it has none."""
        return limits.of(self.key_limits, label) if limited else None

    @staticmethod
    def verdict(model: str, version: int, answer: list, capacity: Capacity, calibration: float, timeout_s: float,
                n: int) -> int:
        """The push script's answer: the items ahead of the request when it was pushed (-1: not
        estimated); raised: 429 past the caller's key limits, 503 if the queue turned it away or
        no worker would compute its items that are not known."""
        verdict, count, *rest = answer
        if verdict == Verdict.PUSHED:
            return rest[0] if rest else -1
        if verdict == Verdict.PAST_RATE:
            raise TooManyRequests("this API key is past its rate on this model; retry later",
                                  retry_after=_seconds(count))
        if verdict == Verdict.AT_CAP:
            raise TooManyRequests("this API key has as many requests under way on this model as it may; "
                                  "retry when one is answered", retry_after=_seconds(count))
        if verdict == Verdict.NOT_KNOWN:
            raise NoWorker(model, version)
        if verdict == Verdict.QUEUE_FULL:
            raise Overloaded(f"the {model} queue is full ({count} jobs); retry shortly",
                             retry_after=retry_after_s(capacity.wait_s(count, 0, calibration))
                             if capacity.known else 1)
        wait_s = capacity.wait_s(count, n, calibration)
        raise Overloaded(f"the {model} queue would answer in about {wait_s:.1f} s, past this "
                         f"request's deadline of {timeout_s:g} s; retry later", retry_after=retry_after_s(wait_s))


def _seconds(ms: int) -> int:
    """A Retry-After in whole seconds, at least one."""
    return max(1, -(-int(ms) // 1000))
