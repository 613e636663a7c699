"""Taking jobs: atomically from the model's queue into this worker's in-flight list.

Jobs are moved, never popped, so a worker that dies holding them leaves them
in funnel:inflight:<worker id> for recovery instead of losing them.
"""

from __future__ import annotations

import time

import redis

from funnel.common.keys import Keys
from funnel.worker.linger import Linger

# Move up to ARGV[1] jobs from the queue's old end into the in-flight list in
# one round trip (RPOP with a count needs Redis 6.2).
_TAKE_MORE = """
local jobs = redis.call('RPOP', KEYS[1], ARGV[1])
if not jobs then return {} end
for i = 1, #jobs do redis.call('LPUSH', KEYS[2], jobs[i]) end
return jobs
"""


POLL_S = 0.001


class JobQueue:
    def __init__(self, client: redis.Redis, keys: Keys, model: str, worker_id: str):
        self.client = client
        self.queue = keys.queue(model)
        self.inflight = keys.inflight(worker_id)
        self._take_more = client.register_script(_TAKE_MORE)
        # Jobs may sit in our in-flight list from before a restart with the
        # same worker id, or from a take cut short by a Redis error.
        self._maybe_leftovers = True
        self.last_wait_s = 0.0  # how long the last take waited for its batch to fill

    def take(self, batch_size: int, linger: Linger, block_s: float) -> list[bytes]:
        """Block up to block_s for the oldest job, then fill the batch.

        Takes whatever is already queued at once, and waits for more only
        within the linger budget.
        """
        if self._maybe_leftovers:
            leftovers: list[bytes] = self.client.lrange(self.inflight, 0, -1)  # type: ignore[assignment]
            self._maybe_leftovers = False
            if leftovers:
                return leftovers[::-1]  # LPUSHed, so oldest last
        self._maybe_leftovers = True  # until this take completes
        jobs = self._take(batch_size, linger, block_s)
        self._maybe_leftovers = False
        return jobs

    def _take(self, batch_size: int, linger: Linger, block_s: float) -> list[bytes]:
        # BLMOVE takes a fractional timeout (Redis >= 6); redis-py's stub says int.
        first = self.client.blmove(self.queue, self.inflight, block_s, "RIGHT", "LEFT")  # type: ignore[arg-type]
        if first is None:
            return []
        jobs: list[bytes] = [first]  # type: ignore[list-item]  # bytes: the client does not decode
        started = time.monotonic()
        while len(jobs) < batch_size:
            jobs += self._take_more(keys=[self.queue, self.inflight], args=[batch_size - len(jobs)])
            remaining = linger.budget_s(len(jobs), batch_size) - (time.monotonic() - started)
            if len(jobs) >= batch_size or remaining <= 0:
                break
            # Poll rather than block: Redis checks blocking timeouts only about
            # every 100 ms (hz 10), far too coarse for a linger of a few ms.
            time.sleep(min(remaining, POLL_S))
        self.last_wait_s = time.monotonic() - started
        return jobs
