"""How long a worker waits for more jobs once it holds some.

A fixed budget: wait up to linger_ms after the first job for the batch to
fill. Waiting only pays when more jobs are on their way; an adaptive policy
can replace this class without touching the loop.
"""

from __future__ import annotations

import threading


class FixedLinger:
    def __init__(self, linger_ms: float, stop: threading.Event | None = None):
        self.linger_s = max(0.0, linger_ms) / 1000.0
        self.stop = stop or threading.Event()

    def budget_s(self, held: int, batch_size: int) -> float:
        """Seconds to keep waiting for more jobs, counted from the first one taken.

        Zero once a stop is requested: the batch in hand is run at once.
        """
        if held >= batch_size or self.stop.is_set():
            return 0.0
        return self.linger_s
