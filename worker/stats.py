"""A worker's running totals, published in its registry hash on every heartbeat.

Prometheus reads them through the web tier's /metrics (from Redis), so a
worker needs no port of its own: workers in compose or Kubernetes are found
by their registry entries, not scraped one by one. The field names are the
registry's (funnel.common.contracts.registry).
"""

from __future__ import annotations

import threading

from funnel.common.contracts.registry import BATCH_BUCKETS, COST_FIELDS, COUNTERS, bucket_field
from funnel.worker.linger import CostModel


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the heartbeat thread reads while the loop writes
        self.totals: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.batch_sizes = [0] * len(BATCH_BUCKETS)  # per bucket, not cumulative
        self.cost = CostModel(decay=0.9)  # seconds(n) = a·n + b over recent batches: the registry's COST_FIELDS

    def add(self, **increments: float) -> None:
        with self._lock:
            for name, value in increments.items():
                if name not in self.totals:
                    raise KeyError(f"{name!r} is not a registry counter")
                self.totals[name] += value

    def batch(self, size: int, errors: int, infer_s: float, wait_s: float) -> None:
        with self._lock:
            self.totals["batches"] += 1
            self.totals["items"] += size
            self.totals["errors"] += errors
            self.totals["infer_seconds"] += infer_s
            self.totals["wait_seconds"] += wait_s
            if size and infer_s > 0:  # not a batch whose every job failed its check
                self.cost.add(size, infer_s)
            for i, bound in enumerate(BATCH_BUCKETS):
                if size <= bound:
                    self.batch_sizes[i] += 1
                    break

    def fields(self) -> dict[str, str]:
        """Hash fields: the counters, and one field per batch-size bucket."""
        with self._lock:
            out = {name: repr(round(v, 6)) if isinstance(v, float) else str(int(v))
                   for name, v in self.totals.items()}
            out.update({bucket_field(b): str(n) for b, n in zip(BATCH_BUCKETS, self.batch_sizes)})
            if self.cost.sw:
                out.update(zip(COST_FIELDS, (repr(round(v, 6)) for v in self.cost.fit())))
        return out
