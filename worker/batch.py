"""One batch in three steps: prepare (decode, check, collate), run the model, finish (split, postprocess).

The steps are apart so that the worker can overlap them (worker/main.py):
`prepare` on the taker's thread, `run` on the thread that owns the
accelerator, `finish` on the replier's, each on a different batch.

Failures stay with their own item: a job that does not decode, or is not for
this worker's model and version, goes to the dead-letter list, a job with bad
inputs gets its own error reply, and if a run fails as a whole (or its feeds
could not be collated), each of its items is run alone so that only the
culprit fails.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from funnel.common.errors import FunnelError
from funnel.common.keys import Keys
from funnel.common.tasks import Task
from funnel.common.wire import Job, Reply, WireError, decode_job, now_ms, peek_job
from funnel.worker.backend import Backend

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass
class Run:
    """One model call: which of the batch's runnable jobs it holds, its feeds, and what came back."""

    items: list[int]
    feeds: dict[str, np.ndarray] | None  # None: collating failed, so each item runs alone
    rows: list[Outputs | Exception] = field(default_factory=list)  # one per item, once run


@dataclass
class Batch:
    taken: list[bytes] = field(default_factory=list)  # every message taken: forgotten once answered
    taken_ids: list[str] = field(default_factory=list)  # each one's job id ("" if it has none)
    jobs: list[Job] = field(default_factory=list)  # decoded, for this model and version, not expired
    runnable: list[Job] = field(default_factory=list)  # those that passed the task's check
    runs: list[Run] = field(default_factory=list)
    replies: list[tuple[str, Reply]] = field(default_factory=list)  # (reply key, reply)
    dead: list[bytes] = field(default_factory=list)
    expired: int = 0
    started: int = 0  # epoch ms when its take ended: each job's queue_ms runs up to here
    wait_s: float = 0.0  # how long the take waited for the batch to fill
    collate_ms: float = 0.0
    run_ms: float = 0.0
    steps: dict[str, tuple[int, int]] = field(default_factory=dict)  # step -> (start, end), epoch ns: its trace

    @property
    def infer_ms(self) -> float:
        """What the batch cost to compute: collating and running it (what the linger and the shedding learn)."""
        return self.collate_ms + self.run_ms

    @property
    def errors(self) -> int:
        return sum(not reply.ok for _, reply in self.replies)


def decode(raws: list[bytes], model: str, keys: Keys, worker_id: str, version: int = 1) -> Batch:
    """Sort taken messages into runnable jobs, dead letters and expired jobs (a worker serves one
    version of one model: a job for another is a dead letter, as an undecodable one)."""
    batch = Batch(taken=raws, started=now_ms())
    for raw in raws:
        batch.taken_ids.append("")
        try:
            job = decode_job(raw)
            batch.taken_ids[-1] = job.id
            if job.model != model or job.version != version or not keys.answers_to(job.reply_to, model):
                raise WireError(f"job for model {job.model!r} version {job.version} replying to "
                                f"{job.reply_to!r} does not belong on this queue")
        except WireError as exc:
            log.warning("dead-lettering a job this worker cannot run (%d bytes): %s", len(raw), exc)
            batch.dead.append(raw)
            seen = peek_job(raw)
            batch.taken_ids[-1] = seen.get("id", "")
            if "id" in seen and keys.answers_to(seen.get("reply_to", ""), model):
                batch.replies.append((seen["reply_to"], Reply.failure(
                    seen["id"], "bad_job", f"job could not be decoded: {exc}", worker=worker_id,
                    version=version)))
            continue
        if job.deadline <= batch.started:
            batch.expired += 1  # its client has been answered 504 already
            continue
        batch.jobs.append(job)
    return batch


def prepare(raws: list[bytes], task: Task, model: str, keys: Keys, worker_id: str, version: int = 1) -> Batch:
    """Decode the taken messages and collate their jobs."""
    batch = decode(raws, model, keys, worker_id, version)
    collate(batch, task, worker_id, version)
    return batch


def collate(batch: Batch, task: Task, worker_id: str, version: int = 1) -> None:
    """Check each job, and collate the runnable ones into runs (one per bucket of the task's)."""
    for job in batch.jobs:
        try:
            task.check(job.inputs)
            batch.runnable.append(job)
        except FunnelError as exc:
            batch.replies.append((job.reply_to, Reply.failure(
                job.id, exc.code, exc.message, worker=worker_id, version=version)))
    if not batch.runnable:
        return
    clock = time.perf_counter()
    inputs = [job.inputs for job in batch.runnable]
    for group in task.buckets(inputs):
        try:
            feeds: dict[str, np.ndarray] | None = task.collate([inputs[i] for i in group])
        except Exception:
            log.exception("collating %d items failed; running them one by one", len(group))
            feeds = None
        batch.runs.append(Run(group, feeds))
    batch.collate_ms = (time.perf_counter() - clock) * 1000


def split(outputs: Outputs, n: int) -> list[Outputs]:
    for name, value in outputs.items():
        if len(value) != n:
            raise RuntimeError(f"model returned {len(value)} rows of {name!r} for {n} inputs")
    return [{name: value[i] for name, value in outputs.items()} for i in range(n)]


def _alone(job: Job, task: Task, backend: Backend) -> Outputs | Exception:
    try:
        return split(backend.run(task.collate([job.inputs])), 1)[0]
    except Exception as exc:  # this item alone is at fault
        return exc


def run(batch: Batch, task: Task, backend: Backend) -> None:
    """Run the model once per run of the batch, keeping each item's row (or the exception that was its fault)."""
    clock = time.perf_counter()
    for run_ in batch.runs:
        try:
            if run_.feeds is None:
                raise RuntimeError("its feeds could not be collated")
            run_.rows = list(split(backend.run(run_.feeds), len(run_.items)))
        except Exception:
            log.exception("a run of %d items failed; running them one by one", len(run_.items))
            run_.rows = [_alone(batch.runnable[i], task, backend) for i in run_.items]
        run_.feeds = None  # the inputs are not needed past the run
    batch.run_ms = (time.perf_counter() - clock) * 1000


def finish(batch: Batch, task: Task, worker_id: str, version: int = 1) -> None:
    """Turn every run row into its job's reply, appended to batch.replies; each names the version that computed it."""
    for run_ in batch.runs:
        for i, row in zip(run_.items, run_.rows):
            job = batch.runnable[i]
            reply = Reply(id=job.id, ok=True, worker=worker_id, batch_size=len(batch.runnable),
                          queue_ms=max(0, batch.started - job.enqueued), infer_ms=batch.infer_ms, version=version)
            try:
                if isinstance(row, Exception):
                    raise row
                # A raw job (the /v2 protocol's tensors) wants the model's own rows.
                reply.outputs = row if job.raw else task.postprocess(row)
            except Exception as exc:
                reply.ok, reply.error = False, {"code": "inference_failed", "message": f"{type(exc).__name__}: {exc}"}
            batch.replies.append((job.reply_to, reply))
