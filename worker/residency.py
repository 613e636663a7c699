"""Which of a worker's models are loaded, for a worker that serves several (worker/multiplex.py).

Each model version it serves is in one state: cold (not loaded), loading (on
the loader's thread, while the other models' batches go on), resident, or
failed (its load raised: a missing file, memory run out; or it outlasted
FUNNEL_LOAD_TIMEOUT_S: it is not tried again for FUNNEL_LOAD_RETRY_S, and its
requests are answered 503 naming why). At
most FUNNEL_MAX_RESIDENT models are resident or loading at once, and at most
FUNNEL_MAX_RESIDENT_MB of model files, a chain not counted (it holds no model,
and waits on its steps, which must find room beside it); to make room the least recently used
resident model is evicted, never one with a batch taken and not yet answered
(pinned), nor (until the cold model's work has waited FUNNEL_COLD_AFTER_MS) one
whose own work waits: resident work is served first, and a model is not
evicted and loaded again for every request. One load at a time: loads share
the device with the batches.

A load is claimed first (`funnel:loading:{<model>}:<version>`, a short TTL the
taker renews while it lasts, common/link/lua/load_claim.lua): another worker
that finds the claim held does not load the model for the same work. Once
loaded the claim is left to lapse after CLAIM_KEPT_S, by when the registry
(published at once) shows the model resident there. A worker killed mid-load
leaves the claim to lapse within CLAIM_TTL_S and the jobs in their queue: a
model's jobs are taken only once it is resident. A load that hangs (a stalled
network mount, a driver call that never returns) would keep its claim renewed
forever: past FUNNEL_LOAD_TIMEOUT_S the taker gives it up, marks the model
failed and releases the claim, so a peer may load it and this worker may load
others. Python cannot stop the hung thread; what it returns, if ever, is dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import redis

from funnel.common import tasks
from funnel.common.contracts.keys import Keys
from funnel.common.link import lua_scripts
from funnel.common.store import ModelSpec
from funnel.common.tasks import Task
from funnel.worker.backend import Backend
from funnel.worker.stats import Stats

log = logging.getLogger(__name__)

CLAIM_TTL_S = 5.0  # a dead loader's claim lapses this soon; the taker renews it every turn (at most BLOCK_S)
CLAIM_KEPT_S = 3.0  # past a load, longer than the web tier's and the workers' registry views take to see it
MAX_ERROR = 300  # characters of a load's exception kept for the 503s


@dataclass(frozen=True)
class Loaded:
    """A model version ready to run: its task and its backend."""

    task: Task
    backend: Backend


@dataclass
class Model:
    """One model version a worker serves, and where its loading stands."""

    spec: ModelSpec
    member: str  # its id in the registry (common/contracts/registry.py's member_id)
    stats: Stats
    size_mb: float  # its files, what it is counted against the memory budget
    _: KW_ONLY
    chain: bool = False  # a chain holds no model: it takes no room, none is evicted for it nor it for another
    state: str = "cold"  # common/contracts/registry.py's STATES
    loaded: Loaded | None = None
    error: str = ""
    retry_at: float = 0.0  # monotonic: when a failed model may be tried again
    used_at: float = 0.0  # monotonic: its last batch taken (the least recently used is evicted first)
    pinned: int = 0  # batches taken and not yet answered
    load_started: float = 0.0  # monotonic: when its load under way began
    attempt: int = 0  # its loads begun; a load given up on is one behind, and its result is dropped


@dataclass(kw_only=True)
class Limits:
    max_resident: int = 0  # 0: no limit
    max_resident_mb: float = 0.0  # 0: no limit
    retry_s: float = 60.0
    load_timeout_s: float = 0.0  # 0: a load may take any time


class Residency:
    def __init__(self, client: redis.Redis, keys: Keys, worker_id: str, models: list[Model], limits: Limits,
                 load: Callable[[ModelSpec], Loaded], changed: Callable[[], None] = lambda: None):
        """load: a model's task and backend, warmed up (on the loader's thread); changed: called when
        states change (a load begun with the evictions that make room for it, a load ended, done or failed,
        or given up): the heartbeat publishes every model's state at once."""
        self.client, self.keys, self.worker_id = client, keys, worker_id
        self.models = {model.member: model for model in models}
        self.limits, self._load, self._changed = limits, load, changed
        self._lock = threading.Lock()
        self._loading: Model | None = None
        self._claim = lua_scripts.register(client, "load_claim")

    def state(self, member: str) -> str:
        return self.models[member].state

    def fields(self) -> dict[str, dict[str, str]]:
        """Each model's registry fields beside the worker's (common/contracts/registry.py's MEMBER_FIELDS),
        member id -> fields, all read at one instant: never more resident or loading than the limits."""
        with self._lock:
            return {member: {"process": self.worker_id, "state": model.state, "load_error": model.error}
                    for member, model in self.models.items()}

    def pin(self, member: str) -> Loaded | None:
        """The model's task and backend, held loaded until unpin(); None unless it is resident."""
        with self._lock:
            model = self.models[member]
            if model.loaded is None:
                return None
            model.pinned += 1
            model.used_at = time.monotonic()
            return model.loaded

    def unpin(self, member: str) -> None:
        with self._lock:
            self.models[member].pinned -= 1

    def renew(self) -> None:
        """Keep the claim on the load under way (called every turn of the taker), or give the load up
        once it has outlasted the load timeout."""
        loading = self._loading
        if loading is None:
            return
        timeout_s = self.limits.load_timeout_s
        if timeout_s and time.monotonic() - loading.load_started > timeout_s:
            self._give_up(loading, f"TimeoutError: the load took longer than {timeout_s:g} s "
                                   "(FUNNEL_LOAD_TIMEOUT_S); given up")
        else:
            self._hold_claim(loading, CLAIM_TTL_S)

    def _give_up(self, model: Model, error: str) -> None:
        """The load under way is over for this worker: the model failed, its claim released, the next load
        free to start; its thread's result, if it ever comes, dropped (_run_load)."""
        with self._lock:
            if self._loading is not model or model.state != "loading":  # it ended meanwhile
                return
            model.state, model.error = "failed", error
            model.retry_at = time.monotonic() + self.limits.retry_s
            model.attempt += 1
            self._loading = None
        log.error("could not load %s version %d: %s", model.spec.name, model.spec.version, error)
        self._hold_claim(model, 0)  # released: a peer may load it now
        self._published()

    def load(self, member: str, spare: frozenset[str] = frozenset()) -> bool:
        """Start loading a cold model (or a failed one due for another try) on the loader's thread, making
        room for it first (never by evicting a model of `spare`: those with work waiting); False when it
        cannot start now: a load under way, no room (every resident model pinned or spared), another
        worker's claim."""
        with self._lock:
            model = self.models[member]
            if self._loading is not None or model.state in ("resident", "loading"):
                return False
            if model.state == "failed" and time.monotonic() < model.retry_at:
                return False
            victims = self._room_for(model, spare)
            if victims is None or not self._hold_claim(model, CLAIM_TTL_S):
                return False
            for victim in victims:
                self._evict(victim)
            model.state, self._loading = "loading", model
            model.load_started, model.attempt = time.monotonic(), model.attempt + 1
        self._published()  # the evictions and this load together, before the load's thread starts
        threading.Thread(target=self._run_load, args=(model, model.attempt), name=f"load {model.spec.name}",
                         daemon=True).start()
        return True

    def due(self, member: str) -> bool:
        """Whether a load of the model may start now (cold, or failed and due for another try)."""
        model = self.models[member]
        return model.state == "cold" or (model.state == "failed" and time.monotonic() >= model.retry_at)

    def _room_for(self, incoming: Model, spare: frozenset[str]) -> list[Model] | None:
        """The least recently used unpinned models, not spared, to evict so that `incoming` fits; None if
        it cannot."""
        limits = self.limits
        if incoming.chain:
            return []
        resident = sorted((m for m in self.models.values() if m.state == "resident" and not m.chain),
                          key=lambda m: m.used_at)
        victims: list[Model] = []
        while True:
            kept = [m for m in resident if m not in victims]
            count_ok = not limits.max_resident or len(kept) + 1 <= limits.max_resident
            mb_ok = (not limits.max_resident_mb or not kept
                     or sum(m.size_mb for m in kept) + incoming.size_mb <= limits.max_resident_mb)
            if count_ok and mb_ok:
                return victims
            idle = [m for m in kept if not m.pinned and m.member not in spare]
            if not idle:
                return None
            victims.append(idle[0])

    def evict(self, member: str, why: str) -> bool:
        """Take a resident model out of memory now, unless a batch of it is taken and not yet answered;
        whether it was."""
        with self._lock:
            model = self.models[member]
            if model.state != "resident" or model.pinned:
                return False
            self._evict(model, why)
        self._published()
        return True

    def _evict(self, model: Model, why: str = "to make room") -> None:
        if model.loaded is not None:
            model.loaded.backend.close()  # a model run in Python: its process ends, its memory freed
        model.loaded, model.state = None, "cold"
        model.stats.add(evictions=1)
        log.info("evicted %s version %d %s", model.spec.name, model.spec.version, why)

    def _run_load(self, model: Model, attempt: int) -> None:
        started = time.monotonic()
        try:
            loaded: Loaded | None = self._load(model.spec)
            error = ""
        except Exception as exc:  # a missing file, memory run out: this model fails, the others go on
            loaded, error = None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR]
            log.error("could not load %s version %d: %s", model.spec.name, model.spec.version, error)
        seconds = time.monotonic() - started
        with self._lock:
            if model.attempt != attempt:  # given up on at its timeout: the model is failed, another load free
                log.warning("the load of %s version %d given up on ended after %.1f s; dropped",
                            model.spec.name, model.spec.version, seconds)
                return
            if loaded is not None:
                model.loaded, model.state, model.error, model.used_at = loaded, "resident", "", time.monotonic()
                model.stats.add(loads=1, load_seconds=seconds)
                log.info("loaded %s version %d in %.2f s", model.spec.name, model.spec.version, seconds)
            else:
                model.state, model.error = "failed", error
                model.retry_at = time.monotonic() + self.limits.retry_s
        try:
            self._published()
            self._hold_claim(model, CLAIM_KEPT_S)
        except redis.RedisError as exc:  # the claim lapses by itself; the next beat publishes the state
            log.warning("after loading %s: %s", model.spec.name, exc)
        finally:
            self._loading = None

    def _published(self) -> None:
        """Tell the heartbeat the states changed; a Redis error leaves them to its next beat."""
        try:
            self._changed()
        except redis.RedisError as exc:
            log.warning("could not publish the models' states: %s", exc)

    @property
    def loading(self) -> str | None:
        """The member whose load is under way (until its state is published), else None."""
        loading = self._loading
        return None if loading is None else loading.member

    def _hold_claim(self, model: Model, ttl_s: float) -> bool:
        key = self.keys.loading(model.spec.name, model.spec.version)
        return bool(self._claim(keys=[key], args=[self.worker_id, int(ttl_s * 1000)]))


def files_mb(spec: ModelSpec) -> float:
    """The size of a model version's files: what it is counted against FUNNEL_MAX_RESIDENT_MB."""
    return sum(path.stat().st_size for path in spec.path.rglob("*") if path.is_file()) / 1e6


def is_chain(spec: ModelSpec) -> bool:
    """Whether the model version is a chain (its task a Chain), read without loading it."""
    try:
        return tasks.task_class(spec.task).in_chain()
    except ValueError:  # a task that does not import: its load fails, saying why
        return False
