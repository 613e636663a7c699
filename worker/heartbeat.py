"""Registration and heartbeat: funnel:worker:<id> lives while its worker does.

A thread refreshes the hash's TTL on its own clock, so a long batch never
makes a live worker look dead.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis

from common.keys import Keys

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, client: redis.Redis, keys: Keys, worker_id: str, info: dict,
                 ttl_s: float = 10.0):
        self.client, self.keys, self.worker_id = client, keys, worker_id
        self.info = {**info, "pid": os.getpid(), "host": socket.gethostname(),
                     "started": time.time()}
        self.ttl_s = ttl_s
        self.counters: dict[str, int] = {"batches": 0, "jobs": 0, "expired": 0, "dead": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def count(self, **increments: int) -> None:
        for name, n in increments.items():
            self.counters[name] = self.counters.get(name, 0) + n

    def beat(self) -> None:
        key = self.keys.worker(self.worker_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={**self.info, **self.counters, "seen": time.time()})
        pipe.pexpire(key, int(self.ttl_s * 1000))
        pipe.sadd(self.keys.workers(), self.worker_id)
        pipe.execute()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    def stop(self) -> None:
        """Stop beating and deregister."""
        self._stop.set()
        self._thread.join(timeout=self.ttl_s)
        try:
            self.client.delete(self.keys.worker(self.worker_id))
            self.client.srem(self.keys.workers(), self.worker_id)
        except redis.RedisError as exc:
            log.warning("could not deregister: %s", exc)
