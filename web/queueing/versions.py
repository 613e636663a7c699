"""Which version of a model a request goes to: the model's traffic policy and its live workers.

The policy (common/contracts/traffic.py: version -> weight, in Redis) is read at most
every REFRESH_S per process and model, as the workers are (shedding.py's
WorkerView). A request goes to a weighted version with a live worker, at
random by weight; a weight on a version with no live worker is skipped while
another can serve; with no policy, or none of its versions live, to the
highest version with a live worker; with none live, to the highest version
in the store (answered 503 `no_worker`, or held: FUNNEL_HOLD_WITHOUT_WORKERS). A version unloaded
through the repository API (common/contracts/repository.py, read with the policy) takes no request.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable

import redis

from funnel.common.contracts import repository, traffic
from funnel.common.contracts.keys import Keys
from funnel.web.queueing.shedding import REFRESH_S, WorkerView


class Versions:
    def __init__(self, client: redis.Redis, keys: Keys, workers: WorkerView, refresh_s: float = REFRESH_S,
                 clock=time.monotonic, rng: random.Random | None = None):
        self.client, self.keys, self.workers = client, keys, workers
        self.refresh_s, self.clock, self.rng = refresh_s, clock, rng or random.Random()
        # model -> (read at, its weights, its unloaded versions)
        self._policies: dict[str, tuple[float, dict[int, int], frozenset[int]]] = {}

    def choose(self, model: str, in_store: Iterable[int]) -> int:
        """The version this request of `model` goes to, among the versions the store has."""
        known = set(in_store)
        live = self.workers.live_versions(model) & known
        return traffic.choose(self.weights(model), live, self.rng) or max(known)

    def weights(self, model: str) -> dict[int, int]:
        """The model's traffic policy as this process last read it ({}: none)."""
        return self._policy(model)[1]

    def unloaded(self, model: str) -> frozenset[int]:
        """The model's unloaded versions as this process last read them (common/contracts/repository.py).
        The workers' view is read first, as every request reads it: a Redis that does not answer fails the
        request there, once, not after this read has waited for it too."""
        self.workers.live_versions(model)
        return self._policy(model)[2]

    def _policy(self, model: str) -> tuple[float, dict[int, int], frozenset[int]]:
        policy = self._policies.get(model, (-math.inf, {}, frozenset()))
        if self.clock() - policy[0] >= self.refresh_s:
            try:
                policy = (self.clock(), traffic.read(self.client, self.keys, model),
                          repository.read(self.client, self.keys, model))
            except redis.RedisError:  # the last one read stands; the push that follows answers 503 if Redis is gone
                policy = (self.clock(), *policy[1:])
            self._policies[model] = policy
        return policy
