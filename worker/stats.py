"""A worker's running totals, published in its registry hash on every heartbeat.

Prometheus reads them through the web tier's /metrics (from Redis), so a
worker needs no port of its own: workers in compose or Kubernetes are found
by their registry entries, not scraped one by one.
"""

from __future__ import annotations

import threading

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Stats:
    def __init__(self):
        self._lock = threading.Lock()  # the heartbeat thread reads while the loop writes
        self.totals: dict[str, float] = {
            "batches": 0, "items": 0, "errors": 0, "expired": 0, "dead": 0, "recovered": 0,
            "infer_seconds": 0.0, "wait_seconds": 0.0}
        self.batch_sizes = [0] * len(BATCH_BUCKETS)  # per bucket, not cumulative

    def add(self, **increments: float) -> None:
        with self._lock:
            for name, value in increments.items():
                self.totals[name] = self.totals.get(name, 0) + value

    def batch(self, size: int, errors: int, infer_s: float, wait_s: float) -> None:
        with self._lock:
            self.totals["batches"] += 1
            self.totals["items"] += size
            self.totals["errors"] += errors
            self.totals["infer_seconds"] += infer_s
            self.totals["wait_seconds"] += wait_s
            for i, bound in enumerate(BATCH_BUCKETS):
                if size <= bound:
                    self.batch_sizes[i] += 1
                    break

    def fields(self) -> dict[str, str]:
        """Hash fields: totals, and batch_le_<n> for the batch-size histogram (per bucket)."""
        with self._lock:
            out = {name: repr(round(v, 6)) if isinstance(v, float) else str(v)
                   for name, v in self.totals.items()}
            out.update({f"batch_le_{b}": str(n) for b, n in zip(BATCH_BUCKETS, self.batch_sizes)})
        return out
