"""Load shedding by predicted wait: answer 503 at once what the queue cannot serve in time.

Each web process keeps a view of the live workers of every model, read from
the registry (common/contracts/registry.py) at most once per REFRESH_S, never per
request. From each worker's recent batch cost, seconds(n) = a·n + b, and its
batch size B, the model's throughput when busy is

    rate = sum over its live workers of B / (a·B + b)        (items per second)

and a request of n items that finds `ahead` jobs queued or in the workers'
hands is predicted to be answered after

    wait = max((ahead + n) / rate, a·k + b) · SAFETY + OVERHEAD_S,   k = min(B, ahead + n)

(the backlog drained at full batches, but never less than one batch holding
it). A job holds a request's items, so Redis knows the jobs ahead, not their
items: each process keeps its mean items per job per model (JobSizes) and the
push script counts each job ahead as that many.

The workers' timings lag a sudden slowdown (a busier machine, a throttled GPU)
by a heartbeat or two, while the answers show it at once: each process keeps
a Calibration per model, how much later than predicted its answers came
lately, and scales SAFETY by it. The push script (web/pipeline.py) reads the
queue and in-flight lengths, computes the same wait and pushes only if it fits
the request's remaining deadline, in the one round trip a request already
made. A request turned away is told to come back once the work ahead of it is
done: Retry-After = ceil(wait). A model with no live worker answers 503 at once,
unless FUNNEL_HOLD_WITHOUT_WORKERS holds its requests (scale from zero). A
worker that deregistered, or whose heartbeat expired while Redis answered, is
gone; only right after Redis failed or lost its data (a new registry epoch,
common/contracts/registry.py) may live workers be missing from the registry until their
next beat, and a model served before keeps a grace (WorkerView.grace_s): a
request admitted on it is answered 503 when the grace ends without a worker
(web/pipeline.py).

A worker serving several models (worker/residency.py) lists each model it can
load as a worker of it, loaded or not, its own id in the field `process`. One
process runs one batch at a time, whichever model's: its rate is shared, each
of its members counting 1/k of its own rate, k the models the process holds
loaded or is loading (at least 1; a model it would load takes a loaded one's
place), chains aside (their batches run on threads of their own, and hold no
model). Traffic on all k runs at the process's rate in sum; traffic on fewer
of them than it holds loaded is predicted slower than it runs (the safe side:
counted once per model, k models loaded were predicted k times as fast as they
run). While none of a model version's live workers has it loaded, the wait
predicted adds the time its workers took to load it lately (`cold_s`); while
every one of them failed to load it, a request is answered 503
`model_unavailable` at once, naming why (`unavailable`).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass

import redis

from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import JOB_FORMAT
from funnel.common.errors import BadInput

REFRESH_S = 1.0  # how stale a process's view of the workers may be
EMPTY_REFRESH_S = 0.1  # when it shows no worker for a model: a new worker is seen this soon
SAFETY = 1.2  # the workers' timings cover inference only: taking, decoding and replying add some
OVERHEAD_S = 0.02  # the reply's way back to the client
MAX_RETRY_AFTER_S = 300
# Calibration: only waits this long are mostly queueing (shorter ones are linger and the reply's
# way back, which OVERHEAD_S covers); each such answer moves the factor this far toward
# actual/predicted; without answers it relaxes to 1 with this half-life.
CALIBRATE_MIN_S = 0.25
CALIBRATE_WEIGHT = 0.25
CALIBRATE_HALF_LIFE_S = 10.0
MAX_CALIBRATION = 4.0
JOB_SIZE_WEIGHT = 0.05  # how far each request moves the mean items of a job
# A model this process saw served this recently, before Redis lost its data (a new epoch), is not
# refused for want of a worker: the emptied registry fills again at each worker's next heartbeat
# (FUNNEL_HEARTBEAT_TTL_S / 3).
NO_WORKER_GRACE_S = 10.0
TIMEOUT_HEADER = "X-Request-Timeout"


def request_timeout(headers, cap_s: float) -> float:
    """The request's deadline in seconds: X-Request-Timeout if given, never over FUNNEL_REQUEST_TIMEOUT_S."""
    given = headers.get(TIMEOUT_HEADER)
    if given is None:
        return cap_s
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadInput(f"{TIMEOUT_HEADER} must be a positive number of seconds, not {given[:40]!r}",
                       code="bad_timeout")
    return min(seconds, cap_s)


@dataclass(frozen=True)
class Capacity:
    """What a model's live workers can do, as one process last read it from the registry."""

    workers: tuple[str, ...]  # live worker ids (their in-flight lists count as work ahead)
    _: KW_ONLY
    rate: float = 0.0  # items per second at full batches; 0: no worker has timed a batch yet
    item_s: float = 0.0  # a, averaged over the workers that have timed batches
    batch_s: float = 0.0  # b, likewise
    batch_size: int = 1  # B, likewise
    lanes: bool = True  # every live worker takes the priority lanes (false while older ones serve too)
    job_format: int = JOB_FORMAT  # the oldest job format a live worker reads (common/contracts/wire.py)
    cold_s: float = 0.0  # no live worker has the model loaded: what loading it took them lately
    unavailable: str = ""  # every live worker failed to load the model: why

    @property
    def known(self) -> bool:
        return self.rate > 0

    def wait_s(self, ahead: int, n: int, calibration: float = 1.0) -> float:
        """Predicted seconds until a request of n items, behind `ahead` jobs, is answered."""
        k = min(self.batch_size, ahead + n)
        return (max((ahead + n) / self.rate, self.item_s * k + self.batch_s) * SAFETY * calibration + OVERHEAD_S
                + self.cold_s)

    def script_args(self, calibration: float = 1.0) -> list[str]:
        """The estimate's parameters for the push script (which computes wait_s in Lua)."""
        return [*self._measured, repr(SAFETY * calibration), self._overhead]

    @functools.cached_property
    def _measured(self) -> tuple[str, ...]:  # written out once a registry reading: every push sends them
        return tuple(repr(v) for v in (self.rate, self.item_s, self.batch_s, self.batch_size))

    @functools.cached_property
    def _overhead(self) -> str:
        return repr(OVERHEAD_S + self.cold_s)


def capacity(workers: list[dict[str, str]], model: str, version: int = 1) -> Capacity:
    """A model version's Capacity from the registry's live workers."""
    mine = [w for w in workers if w.get("model") == model and registry.version_of(w) == version]
    timed = [registry.batch_cost(w) for w in mine]
    costs = [c for c in timed if c]
    lanes = all(registry.takes_lanes(w) for w in mine)
    job_format = min((registry.job_format(w) for w in mine), default=JOB_FORMAT)
    cold_s = 0.0 if any(registry.resident(w) for w in mine) else max(map(registry.load_s, mine), default=0.0)
    errors = [registry.load_error(w) for w in mine]
    unavailable = errors[0] if errors and all(errors) else ""
    if not costs:  # the batch size alone, for splitting requests into jobs (web/pipeline.py)
        sizes = [int(w["batch_size"]) for w in mine if w.get("batch_size", "").isdigit() and int(w["batch_size"]) > 0]
        return Capacity(tuple(w["id"] for w in mine), batch_size=max(sizes, default=1), lanes=lanes,
                        job_format=job_format, cold_s=cold_s, unavailable=unavailable)
    mean = len(costs)
    # A worker not timed yet (just started) is assumed as fast as the mean of the others.
    unknown_rate = sum(size / (item_s * size + batch_s) for item_s, batch_s, size in costs) / mean
    share = shared_by(workers)
    rate = sum((c[2] / (c[0] * c[2] + c[1]) if c else unknown_rate) * share(w) for c, w in zip(timed, mine))
    return Capacity(tuple(w["id"] for w in mine), rate=rate,
                    item_s=sum(c[0] for c in costs) / mean, batch_s=sum(c[1] for c in costs) / mean,
                    batch_size=max(1, round(sum(c[2] for c in costs) / mean)), lanes=lanes,
                    job_format=job_format, cold_s=cold_s, unavailable=unavailable)


def shared_by(workers: list[dict[str, str]]) -> Callable[[dict[str, str]], float]:
    """Each worker's share of its process's time: 1/k for a member of a process holding k models loaded or
    loading (at least 1), 1 for a worker of one model (no `process` field) and for a chain's member, whose
    batches run on a thread of their own, holding no model (worker/multiplex.py)."""
    def sharing(w: dict[str, str]) -> bool:
        return bool(w.get("process")) and w.get("backend") != "chain"
    held = Counter(w["process"] for w in workers if sharing(w) and w.get("state") in ("resident", "loading"))
    return lambda w: 1 / max(1, held[w["process"]]) if sharing(w) else 1.0


class Calibration:
    """Per model, how much later than predicted this process's answers came lately (1: on time).

    Never below 1: the registry's timings are the floor. Thread-safe enough: each
    update is one assignment of a tuple.
    """

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._last: dict[str, tuple[float, float]] = {}  # model -> (factor, when observed)

    def factor(self, model: str) -> float:
        factor, at = self._last.get(model, (1.0, 0.0))
        return 1.0 + (factor - 1.0) * 0.5 ** ((self.clock() - at) / CALIBRATE_HALF_LIFE_S)

    def observe(self, model: str, predicted_s: float, actual_s: float) -> None:
        """An answer (or a timeout, actual_s = the deadline) to a request predicted at predicted_s (factor 1)."""
        if predicted_s < CALIBRATE_MIN_S:
            return
        current = self.factor(model)
        ratio = min(MAX_CALIBRATION, max(1.0, actual_s / predicted_s))
        self._last[model] = (current + CALIBRATE_WEIGHT * (ratio - current), self.clock())


class JobSizes:
    """Per model, the items of this process's jobs on average lately: what a job ahead counts as.

    Thread-safe enough, as Calibration: each update is one assignment.
    """

    def __init__(self) -> None:
        self._mean: dict[str, float] = {}

    def of(self, model: str) -> float:
        return self._mean.get(model, 1.0)

    def observe(self, model: str, items: int, jobs: int) -> None:
        mean = self.of(model)
        self._mean[model] = mean + JOB_SIZE_WEIGHT * (items / jobs - mean)


def retry_after_s(wait_s: float) -> int:
    """Retry-After for a request turned away: when the work ahead of it should be done."""
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(wait_s)))


class WorkerView:
    """The live workers of every model, read from the registry at most every REFRESH_S per process.

    Costs three round trips per refresh (the worker list, their hashes in one
    pipeline, the registry's epoch), shared by all of the process's requests. Thread-safe: one thread
    refreshes while the others keep using the last view.
    """

    def __init__(self, client: redis.Redis, keys: Keys, refresh_s: float = REFRESH_S,
                 clock=time.monotonic):
        self.client, self.keys, self.refresh_s, self.clock = client, keys, refresh_s, clock
        self._workers: list[dict[str, str]] | None = None
        self._read_at = -math.inf
        self._lock = threading.Lock()
        # (model, version) -> when this process last saw a live worker of it, and the disturbances by then
        self._served_at: dict[tuple[str, int], tuple[float, int]] = {}
        self._epoch = ""  # the registry's epoch at the last read (registry.epoch)
        # Redis lost its data (a new epoch) or failed a read: how many times, and the last one's span
        self._disturbances = 0
        self._disturbed = (-math.inf, -math.inf)  # (its first failed read or new epoch, its first good read after)
        # (model, version) -> (the view it was computed from, its capacity)
        self._computed: dict[tuple[str, int], tuple[list, Capacity]] = {}
        self._live: dict[str, tuple[list, set[int]]] = {}  # model -> (the view, its live versions)

    def grace_s(self, model: str, version: int = 1) -> float:
        """Seconds a request for a model version without a live worker may still wait for one.

        When this process saw the version served up to Redis's last disturbance (it failed, or lost
        its data: a new epoch), its workers may be alive but missing from the registry, their
        heartbeats expired meanwhile or forgotten, until their next beat: what is left of
        NO_WORKER_GRACE_S after the disturbance. Else 0: workers that left (deregistered, or their
        heartbeats expired while Redis answered) are gone."""
        seen_at, disturbances = self._served_at.get((model, version), (-math.inf, self._disturbances))
        started, ended = self._disturbed
        if disturbances == self._disturbances or started - seen_at > NO_WORKER_GRACE_S:
            return 0.0
        return max(0.0, NO_WORKER_GRACE_S - (self.clock() - ended))

    def capacity(self, model: str, version: int = 1) -> Capacity:
        found = self._capacity(model, version)
        if found.workers:
            self._served_at[model, version] = (self.clock(), self._disturbances)
        return found

    def live_versions(self, model: str) -> set[int]:
        """The versions of a model with a live worker, in the current view (computed once per view)."""
        view = self._view(bool(self._workers))
        computed = self._live.get(model)
        if computed is None or computed[0] is not view:
            computed = self._live[model] = (view, registry.versions_live(view, model))
        return computed[1]

    def _capacity(self, model: str, version: int) -> Capacity:
        if self._workers is not None:
            last = self._of(self._workers, model, version)
            return self._of(self._view(bool(last.workers)), model, version)
        return self._of(self._view(False), model, version)

    def _view(self, patient: bool) -> list[dict[str, str]]:
        """The live workers, re-read when stale: sooner while it shows none for what is asked.

        patient: what is asked has workers in the last view; then a stale view is re-read by
        one thread while the others go on with the last one, else they wait for the fresh one.
        """
        now = self.clock()
        if self._workers is not None:
            if now - self._read_at < (self.refresh_s if patient else EMPTY_REFRESH_S):
                return self._workers
            if not self._lock.acquire(blocking=not patient):
                return self._workers
        else:
            self._lock.acquire()
        try:
            if self._read_at <= now:  # nobody refreshed it while this thread waited
                self._read()
            return self._workers or []
        finally:
            self._lock.release()

    def _read(self) -> None:
        """The registry read, and whether Redis was disturbed since the last one (grace_s)."""
        started, ended = self._disturbed
        try:
            workers = registry.live_workers(self.client, self.keys)
            epoch = registry.epoch(self.client, self.keys)
        except redis.RedisError:
            if ended != math.inf:  # a disturbance begins
                self._disturbances += 1
                self._disturbed = (self.clock(), math.inf)
            raise
        if ended == math.inf:  # and ends
            self._disturbed = (started, self.clock())
        if epoch != self._epoch and self._epoch:  # Redis lost its data since the last read
            self._disturbances += 1
            self._disturbed = (self.clock(), self.clock())
        self._workers, self._epoch, self._read_at = workers, epoch, self.clock()

    def _of(self, workers: list[dict[str, str]], model: str, version: int) -> Capacity:
        """capacity(), computed once per view and model version, not once per request."""
        computed = self._computed.get((model, version))
        if computed is None or computed[0] is not workers:
            computed = self._computed[model, version] = (workers, capacity(workers, model, version))
        return computed[1]
