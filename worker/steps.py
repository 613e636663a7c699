"""The worker loop's steps, each on one batch: take and collate, run, reply.

worker/main.py runs them on three threads at once, each on a different
batch; everything a step needs besides its batch is here.

While a batch runs, the next one is taken as late as still lets it be ready
when the run ends (the run's expected time, fitted to the batches run so
far, less what taking and collating took lately, less LEAD_S): jobs that
arrive meanwhile join it, where a take at the run's start would leave them
to the linger's polls or to the batch after.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import redis

from funnel.common.contracts import statistics
from funnel.common.contracts.keys import Keys
from funnel.common.observability import tracing
from funnel.common.tasks import Task
from funnel.worker import batch as batching
from funnel.worker.backend import Backend
from funnel.worker.chain import ChainRunner
from funnel.worker.hold import Hold
from funnel.worker.linger import CostModel, Linger
from funnel.worker.queue import JobQueue
from funnel.worker.reply import Replier
from funnel.worker.settings import WorkerSettings
from funnel.worker.stats import Stats

log = logging.getLogger("funnel.worker")
batch_log = logging.getLogger("funnel.worker.batch")

BLOCK_S = 1.0  # longest idle wait, so a stop request is seen within a second
# A Sentinel failover ends within seconds: a worker asleep longer than this after it adds to
# every waiting request, and two tries a second cost a Redis that is down nothing.
MAX_BACKOFF_S = 0.5
LEAD_S = 0.0005  # a late take's margin for waking up and handing its batch over


@dataclass(kw_only=True)
class Steps:
    settings: WorkerSettings
    task: Task  # the model version served (task.spec names it)
    backend: Backend
    device: str
    batch_size: int
    keys: Keys
    queue: JobQueue
    replier: Replier
    linger: Linger
    stats: Stats
    stop: threading.Event
    hold: Hold  # the fault suite's seam (worker/hold.py); unset, it does nothing
    spans: tracing.Spans
    run_cost: CostModel = field(default_factory=CostModel)  # a run's seconds by its items, fed by reply
    run_fit: tuple[float, float] = (0.0, 0.0)  # run_cost's (a, b), for the taker to read whole
    prepare_s: float = 0.0  # how long taking and collating took lately
    handed: int = 0  # items to run in the batch this step returned last

    @property
    def model(self) -> str:
        return self.task.spec.name

    @property
    def version(self) -> int:
        return self.task.spec.version

    def take_and_collate(self, block_s: float = BLOCK_S) -> batching.Batch | None:
        """The next batch, its jobs moved to the in-flight list and collated; None if none came within
        block_s (0: none queued now).

        Called as the batch it returned last starts to run.
        """
        if self.pace():
            return None  # stopped: take nothing more
        started = time.monotonic()
        taken = retrying(lambda: self.queue.take(self.batch_size, self.linger, block_s), self.stop)
        if taken is None:  # stopped while Redis was down
            return None
        if taken.left:  # jobs the take dropped, their clients gone
            self.stats.add(left=taken.left)
        if not taken.jobs:
            return None
        wait_s = taken.wait_s
        self.hold("take")
        began = time.time_ns()
        batch = batching.prepare(taken.jobs, self.task, self.model, self.keys, self.settings.worker_id, self.version,
                                 self.batch_size)
        batch.steps["collate"] = (began, time.time_ns())
        batch.wait_s = wait_s
        self.hold("collate")
        self.prepare_s = 0.8 * self.prepare_s + 0.2 * (time.monotonic() - started - wait_s)
        self.handed = len(batch.items)
        return batch

    def busy(self) -> bool:
        """Whether a batch taken is answered outside the loop (worker/multiplex.py's chains); never here."""
        return False

    def pace(self) -> bool:
        """Wait until the batch returned last nears its run's end; True if stopped meanwhile."""
        handed, self.handed = self.handed, 0
        if not handed:
            return False
        a, b = self.run_fit
        return self.stop.wait(a * handed + b - self.prepare_s - LEAD_S)  # at once if that is not ahead

    def run(self, batch: batching.Batch) -> None:
        began = time.time_ns()
        if isinstance(self.backend, ChainRunner):  # a chain's items go to its steps' queues
            self.backend.run_batch(batch)
        else:
            batching.run(batch, self.task, self.backend)
        batch.steps["run"] = (began, time.time_ns())
        self.hold("run")

    def reply(self, batch: batching.Batch) -> None:
        """Postprocess, write the replies and forget the batch's jobs in flight (one transaction); learn from it."""
        began = time.time_ns()
        batching.finish(batch, self.task, self.settings.worker_id, self.version)
        self.hold("reply")
        counted = statistics.commands(self.keys, self.model, self.version, statistics.increments(figures(batch)),
                                     time.time_ns() // 1_000_000)
        if retrying(lambda: self._write(batch, counted), self.stop, until_done=True):
            self.queue.forget(len(batch.taken))
        batch.steps["reply"] = (began, time.time_ns())
        self._tell(batch)
        self.linger.observe((len(batch.items), batch.infer_ms / 1000),
                            [job.enqueued for job in batch.jobs for _ in job.items])
        if batch.items:
            self.run_cost.add(len(batch.items), batch.run_ms / 1000)
            self.run_fit = self.run_cost.fit()
        self._record(batch)

    def _write(self, batch: batching.Batch, counted: list[tuple]) -> bool:
        self.replier.answer(batch.replies, batch.dead, batch.taken, batch.taken_ids,
                            {job.id: job.cache for job in batch.jobs if job.cache}, counted)
        return True

    def _tell(self, batch: batching.Batch) -> None:
        """The log lines about each job (their requests' ids in them), and the batch's spans: each
        traced job's time in the queue, a child of its request's span, and the batch's own."""
        requests = {job.id: job.request_id for job in batch.jobs}
        for _, reply in batch.replies:
            if not reply.ok:
                log.warning("job %s failed: %s", reply.id, (reply.error or {}).get("message", ""),
                            extra={"request_id": requests.get(reply.id, "")})
        if log.isEnabledFor(logging.DEBUG):
            for job in batch.runnable:
                log.debug("job %s answered in a batch of %d items", job.id, len(batch.items),
                          extra={"request_id": job.request_id})
        if self.spans.tracer is None:
            return
        taken_ns = batch.steps["collate"][0]  # the take's end, to the nanosecond
        for job in batch.jobs:
            self.spans.waited("queue", job.trace, job.enqueued * 1_000_000, taken_ns, model=self.model,
                              worker=self.settings.worker_id)
        first, last = batch.steps["collate"][0], batch.steps["reply"][1]
        self.spans.batch(f"batch {self.model}", [job.trace for job in batch.jobs], first, last, batch.steps,
                         model=self.model, model_version=self.version, batch_size=len(batch.items),
                         worker=self.settings.worker_id, device=self.device)

    def _record(self, batch: batching.Batch) -> None:
        self.stats.batch(len(batch.items), batch.errors, batch.infer_ms / 1000, batch.wait_s)
        self.stats.add(expired=batch.expired, dead=len(batch.dead))
        if self.settings.log_batches:
            batch_log.info("batch model=%s size=%d errors=%d expired=%d dead=%d wait_ms=%.1f infer_ms=%.1f",
                           self.model, len(batch.items), batch.errors, batch.expired, len(batch.dead),
                           batch.wait_s * 1000, batch.infer_ms)


def figures(batch: batching.Batch) -> statistics.BatchFigures:
    """What the batch adds to its model version's statistics, as its replies are written: each job's
    time from its push (the web tier's stamp) to now, and the batch's steps."""
    now_ns = time.time_ns()
    enqueued = {job.id: job.enqueued for job in batch.jobs}
    ok = [reply for _, reply in batch.replies if reply.ok and reply.id in enqueued]
    failed = [reply for _, reply in batch.replies if not reply.ok and reply.id in enqueued]
    return statistics.BatchFigures(
        items=len(batch.items), ok_ns=[max(0, now_ns - enqueued[r.id] * 1_000_000) for r in ok],
        failed_ns=[max(0, now_ns - enqueued[r.id] * 1_000_000) for r in failed],
        queue_ns=sum(int(r.queue_ms * 1_000_000) for r in ok), collate_ns=int(batch.collate_ms * 1_000_000),
        run_ns=int(batch.run_ms * 1_000_000), finish_ns=int(batch.finish_ms * 1_000_000))


def retrying(call, stop: threading.Event, until_done: bool = False):
    """Run a Redis call, waiting out outages with capped exponential backoff.

    Taking gives up when asked to stop; answering keeps trying a while longer,
    since the batch in hand has been computed (if Redis never returns, the
    jobs stay in the in-flight list for recovery).
    """
    delay, tries = 0.05, 0
    while True:
        try:
            return call()
        except redis.RedisError as exc:
            tries += 1
            if stop.is_set() and (not until_done or tries > 20):
                return None
            log.warning("redis unavailable (%s); retrying in %.2f s", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
