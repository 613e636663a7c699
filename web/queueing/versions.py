"""Which version of a model a request goes to: the model's traffic policy and its live workers.

The policy (common/contracts/traffic.py: version -> weight, in Redis) is read at most
every REFRESH_S per process and model, as the workers are (shedding.py's
WorkerView). A request goes to a weighted version with a live worker, at
random by weight; a weight on a version with no live worker is skipped while
another can serve; with no policy, or none of its versions live, to the
highest version with a live worker; with none live, to the highest version
in the store (answered 503 `no_worker`, or held: FUNNEL_HOLD_WITHOUT_WORKERS).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable

import redis

from funnel.common.contracts import traffic
from funnel.common.contracts.keys import Keys
from funnel.web.queueing.shedding import REFRESH_S, WorkerView


class Versions:
    def __init__(self, client: redis.Redis, keys: Keys, workers: WorkerView, refresh_s: float = REFRESH_S,
                 clock=time.monotonic, rng: random.Random | None = None):
        self.client, self.keys, self.workers = client, keys, workers
        self.refresh_s, self.clock, self.rng = refresh_s, clock, rng or random.Random()
        self._policies: dict[str, tuple[float, dict[int, int]]] = {}  # model -> (read at, weights)

    def choose(self, model: str, in_store: Iterable[int]) -> int:
        """The version this request of `model` goes to, among the versions the store has."""
        known = set(in_store)
        live = self.workers.live_versions(model) & known
        return traffic.choose(self.weights(model), live, self.rng) or max(known)

    def weights(self, model: str) -> dict[int, int]:
        """The model's traffic policy as this process last read it ({}: none)."""
        read_at, weights = self._policies.get(model, (-math.inf, {}))
        if self.clock() - read_at >= self.refresh_s:
            try:
                weights = traffic.read(self.client, self.keys, model)
            except redis.RedisError:
                pass  # the last policy read stands; the push that follows answers 503 if Redis is gone
            self._policies[model] = (self.clock(), weights)
        return weights
