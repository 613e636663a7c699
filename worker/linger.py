"""How long a worker waits for more jobs once it holds some.

Waiting only pays when more jobs are on their way and merging them saves
work: a batch of n costs about a·n + b (b the fixed cost of one run, as
BentoML's dispatcher fits it). A busy worker that waits w for each batch
serves n items every a·n + b + w seconds; with jobs arriving at rate r, a
longer wait raises that rate only while r·(b + w) > n (the sign of its
derivative). So the worker waits only while its batch holds fewer items than
are expected within one run's fixed cost (r·b), and never longer than the
maximum linger (linger_ms). One client at a time (r·b below one) sees no
waiting at all; a batch that already shares its fixed cost that widely runs
at once, where a wait would only idle the model; a busy queue fills batches
by itself, since the worker first takes whatever is already queued.
"""

from __future__ import annotations

import collections
import threading
import time


class CostModel:
    """latency(n) = a·n + b, fitted by exponentially weighted least squares."""

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.sw = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, n: int, seconds: float) -> None:
        d = self.decay
        self.sw, self.sx, self.sy = d * self.sw + 1, d * self.sx + n, d * self.sy + seconds
        self.sxx, self.sxy = d * self.sxx + n * n, d * self.sxy + n * seconds

    def fit(self) -> tuple[float, float]:
        """(a, b); b is 0 until batches of at least two sizes have been seen (a line needs two points:
        with one size, or one batch, the determinant is zero)."""
        det = self.sw * self.sxx - self.sx * self.sx
        if det <= 1e-9 * max(1.0, self.sw * self.sxx):
            mean_n = self.sx / self.sw if self.sw else 1.0
            return (self.sy / self.sw / mean_n if self.sw else 0.0), 0.0
        a = (self.sw * self.sxy - self.sx * self.sy) / det
        b = (self.sy - a * self.sx) / self.sw
        return max(a, 0.0), max(b, 0.0)


class Linger:
    """Wait for more jobs only while a batch holds fewer than are expected within one run's fixed cost."""

    WINDOW_S = 2.0  # arrival rate over the last two seconds of enqueue times

    def __init__(self, max_linger_ms: float, stop: threading.Event | None = None):
        self.linger_s = max(0.0, max_linger_ms) / 1000.0
        self.stop = stop or threading.Event()
        self.cost = CostModel()
        self.arrivals: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def observe(self, size_and_seconds: tuple[int, float], enqueued_ms: list[int]) -> None:
        """A batch ran: its size and inference seconds, and its jobs' enqueue stamps (epoch ms)."""
        size, seconds = size_and_seconds
        with self._lock:
            if size:
                self.cost.add(size, seconds)
            self.arrivals.extend(sorted(t / 1000 for t in enqueued_ms))
            self._trim(time.time())

    def _trim(self, now: float) -> None:
        while self.arrivals and self.arrivals[0] < now - self.WINDOW_S:
            self.arrivals.popleft()

    def arrival_rate(self) -> float:
        """Jobs per second seen arriving lately (by their enqueue stamps)."""
        with self._lock:
            now = time.time()
            self._trim(now)
            if len(self.arrivals) < 2:
                return 0.0
            return len(self.arrivals) / max(now - self.arrivals[0], 1e-3)

    def budget_s(self, held: int, batch_size: int) -> float:
        """Seconds to keep waiting for more jobs, counted from the first one taken (0: run now).

        Zero once a stop is requested: the batch in hand is run at once.
        """
        if held >= batch_size or self.stop.is_set() or self.linger_s == 0:
            return 0.0
        rate = self.arrival_rate()
        _, fixed_cost = self.cost.fit()
        if held >= rate * fixed_cost:
            return 0.0  # it holds what one run's fixed cost sees arrive: waiting would cost more than it merges
        return min(self.linger_s, (batch_size - held) / rate)
