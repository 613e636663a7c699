"""Registration and heartbeat: funnel:worker:{<model>}:<id> lives while its worker does.

A thread refreshes the key's TTL on its own clock, so a long batch never
makes a live worker look dead, and on the same clock sweeps for dead peers
whose jobs need recovering. Only once its own beats have reached Redis on
time for a whole TTL: an outage it saw (a Sentinel failover, a restart) its
peers saw too, and their hashes may have expired meanwhile, while they live
and beat again within a third of a TTL.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.worker.recovery import Recovery
from funnel.worker.stats import Stats

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One registry hash the heartbeat keeps: a worker's, or one model's of a worker serving several."""

    worker_id: str
    info: dict
    stats: Stats = field(default_factory=Stats)


class Heartbeat:
    def __init__(self, client: redis.Redis, keys: Keys, worker_id: str, info: dict,
                 recovery: Recovery, ttl_s: float = 10.0):
        self.client, self.keys, self.worker_id = client, keys, worker_id
        self.common = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        self.members = [Member(worker_id, {**info, **self.common})]
        self.stats = self.members[0].stats
        self.recovery, self.ttl_s = recovery, ttl_s
        # Fields of members read afresh on every beat, member id -> fields, all as of one instant (the
        # states of a worker's models: worker/residency.py).
        self.live: Callable[[], dict[str, dict[str, str]]] = dict
        self._beating = threading.Lock()  # a beat's reading is written before the next beat reads
        self._stop = threading.Event()
        self._steady_since = time.monotonic()  # since when every beat has reached Redis on time
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    @property
    def info(self) -> dict:
        return self.members[0].info

    def join(self, worker_id: str, info: dict) -> Member:
        """Keep another hash (a worker serving several models: one per model), from start() on."""
        self.members.append(Member(worker_id, {**info, **self.common}))
        return self.members[-1]

    def start(self) -> None:
        for member in self.members:
            # A previous life under this id is over: recover what it held, then register.
            self.client.delete(self.keys.worker(member.info["model"], member.worker_id))
            member.stats.add(recovered=self.recovery.recover(member.worker_id, member.info["model"]))
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        """Publish every member's hash in one round trip; called on the heartbeat's clock and whenever a
        member's state changes. Beats are serialized, so an older reading never overwrites a newer one."""
        with self._beating:
            live, seen = self.live(), time.time()
            registry.publish_all(self.client, self.keys,
                                 {m.worker_id: {**m.info, **m.stats.fields(), **live.get(m.worker_id, {}),
                                                "seen": seen} for m in self.members},
                                 self.ttl_s)

    def _run(self) -> None:
        beaten = time.monotonic()
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            now = time.monotonic()
            if now - beaten > self.ttl_s / 2:  # late (Redis failed, or answered slowly): the peers were too
                self._steady_since = now
            beaten = now
            if now - self._steady_since >= self.ttl_s:
                try:
                    self.stats.add(recovered=self.recovery.sweep())
                except redis.RedisError as exc:
                    log.warning("recovery sweep failed: %s", exc)

    def stop(self) -> None:
        """Stop beating and deregister; jobs still held stay registered for recovery."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.ttl_s)
        for member in self.members:
            try:
                registry.withdraw(self.client, self.keys, member.info["model"], member.worker_id)
            except redis.RedisError as exc:
                log.warning("could not deregister: %s", exc)
