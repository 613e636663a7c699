"""One batch in three steps: prepare (decode, check, collate), run the model, finish (split, postprocess).

The steps are apart so that the worker can overlap them (worker/main.py):
`prepare` on the taker's thread, `run` on the thread that owns the
accelerator, `finish` on the replier's, each on a different batch.

A job holds one request's items (common/contracts/wire.py); the batch runs the items of
all its jobs, in runs of at most the batch size. Failures stay with their own
job: a job that does not decode, or is not for this worker's model and version,
goes to the dead-letter list, a job with a bad item gets its own error reply,
and if a run fails as a whole (or its feeds could not be collated), its halves
are run again, and theirs, until the items at fault are found: only the
culprits' jobs fail, each naming its item, and the others are answered. A run
the model's process could not finish (worker/model_process.py: it timed out or
died) is not run again in parts; its items fail with it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import Job, Reply, WireError, decode_job, now_ms, peek_job
from funnel.common.errors import FunnelError
from funnel.common.tasks import Inputs, Task
from funnel.worker.backend import Backend, Row
from funnel.worker.model_process import Abandoned

log = logging.getLogger(__name__)


@dataclass
class Run:
    """One model call: which of the batch's items it holds, its feeds, and what came back."""

    items: list[int]  # indexes into Batch.items
    feeds: dict[str, np.ndarray] | None  # None: collating failed, so each item runs alone


@dataclass(kw_only=True)
class Batch:
    taken: list[bytes] = field(default_factory=list)  # every message taken: forgotten once answered
    taken_ids: list[str] = field(default_factory=list)  # each one's job id ("" if it has none)
    jobs: list[Job] = field(default_factory=list)  # decoded, for this model and version, not expired
    runnable: list[Job] = field(default_factory=list)  # those whose items all passed the task's check
    items: list[Inputs] = field(default_factory=list)  # the runnable jobs' items, in order: what runs
    rows: list[Row | Exception] = field(default_factory=list)  # each item's row once run (or its fault)
    runs: list[Run] = field(default_factory=list)
    replies: list[tuple[str, Reply]] = field(default_factory=list)  # (reply key, reply)
    dead: list[bytes] = field(default_factory=list)
    expired: int = 0
    refused: bool = False  # its model could not be loaded: answered with an error each, never run
    started: int = 0  # epoch ms when its take ended: each job's queue_ms runs up to here
    wait_s: float = 0.0  # how long the take waited for the batch to fill
    collate_ms: float = 0.0
    run_ms: float = 0.0
    finish_ms: float = 0.0  # splitting and postprocessing its rows: Triton's compute output
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


def prepare(raws: list[bytes], task: Task, model: str, keys: Keys, worker_id: str, version: int = 1,
            batch_size: int = 0) -> Batch:
    """Decode the taken messages and collate their jobs' items."""
    batch = decode(raws, model, keys, worker_id, version)
    collate(batch, task, worker_id, version, batch_size)
    return batch


def collate(batch: Batch, task: Task, worker_id: str, version: int = 1, batch_size: int = 0) -> None:
    """Check each job's items, and collate the runnable ones into runs: one per bucket of the
    task's, in parts of at most batch_size items (0: no limit), as a job may hold more."""
    for job in batch.jobs:
        for i, item in enumerate(job.items):
            try:
                task.check(item)
            except FunnelError as exc:
                batch.replies.append((job.reply_to, Reply.failure(
                    job.id, exc.code, exc.message, worker=worker_id, version=version, item=i)))
                break
        else:
            batch.runnable.append(job)
            batch.items += job.items
    if not batch.items:
        return
    clock = time.perf_counter()
    step = batch_size or len(batch.items)
    for bucket in task.buckets(batch.items):
        for start in range(0, len(bucket), step):
            group = bucket[start:start + step]
            try:
                feeds: dict[str, np.ndarray] | None = task.collate([batch.items[i] for i in group])
            except Exception:
                log.exception("collating %d items failed; running them in parts", len(group))
                feeds = None
            batch.runs.append(Run(group, feeds))
    batch.collate_ms = (time.perf_counter() - clock) * 1000


def _run_once(items: list[Inputs], task: Task, backend: Backend, feeds: dict[str, np.ndarray] | None = None
              ) -> list[Row]:
    rows = backend.run(task.collate(items) if feeds is None else feeds)
    if len(rows) != len(items):
        raise RuntimeError(f"the model answered {len(rows)} rows for {len(items)} items")
    return rows


def _in_parts(items: list[Inputs], task: Task, backend: Backend) -> list[Row | Exception]:
    """After a run of these items failed: each half run again, and a half that fails split again, down to
    the items at fault (a run each for the others' halves, about 2 log2(n) runs for one culprit)."""
    if len(items) == 1:
        try:
            return _run_once(items, task, backend)  # type: ignore[return-value]
        except Exception as exc:  # this item alone is at fault
            return [exc]
    done: list[Row | Exception] = []
    for part in (items[:len(items) // 2], items[len(items) // 2:]):
        try:
            done += _run_once(part, task, backend)
        except Abandoned as exc:
            done += [exc] * len(part)
        except Exception:
            done += _in_parts(part, task, backend)
    return done


def run(batch: Batch, task: Task, backend: Backend) -> None:
    """Run the model once per run of the batch, keeping each item's row (or the exception that was its fault)."""
    clock = time.perf_counter()
    rows: list[Row | Exception] = [RuntimeError("not run")] * len(batch.items)
    for run_ in batch.runs:
        items = [batch.items[i] for i in run_.items]
        try:
            if run_.feeds is None:
                raise RuntimeError("its feeds could not be collated")
            done: list[Row | Exception] = list(_run_once(items, task, backend, run_.feeds))
        except Abandoned as exc:
            log.error("a run of %d items was abandoned: %s", len(items), exc)
            done = [exc] * len(items)
        except Exception:
            log.exception("a run of %d items failed; running it again in parts", len(items))
            done = _in_parts(items, task, backend)
        for i, row in zip(run_.items, done):
            rows[i] = row
        run_.feeds = None  # the inputs are not needed past the run
    batch.rows = rows
    batch.run_ms = (time.perf_counter() - clock) * 1000


def finish(batch: Batch, task: Task, worker_id: str, version: int = 1) -> None:
    """Turn the rows of each runnable job's items into its reply (postprocessed, with each item's
    context), appended to batch.replies; each names the version that computed it. An item that
    failed, in the run or in postprocess, fails its job, named by its index."""
    clock = time.perf_counter()
    start = 0
    for job in batch.runnable:
        rows, start = batch.rows[start:start + len(job.items)], start + len(job.items)
        reply = Reply(id=job.id, ok=True, worker=worker_id, batch_size=len(batch.items),
                      queue_ms=max(0, batch.started - job.enqueued), infer_ms=batch.infer_ms, version=version)
        results = []
        contexts = job.contexts or [None] * len(rows)
        try:
            for row, context in zip(rows, contexts):
                if isinstance(row, Exception):
                    raise row
                # A raw job (the /v2 protocol's tensors) wants the model's own rows; an item's context
                # goes to postprocess only, and only to a task that keeps one.
                results.append(row if job.raw else task.postprocess(row) if context is None
                               else task.postprocess(row, context))
        except FunnelError as exc:  # the task's own: its code and status
            reply.ok, reply.item = False, len(results)
            reply.error = {"code": exc.code, "message": exc.message, "status": exc.status}
        except Exception as exc:
            reply.ok, reply.item = False, len(results)
            reply.error = {"code": "inference_failed", "message": f"{type(exc).__name__}: {exc}"}
        if reply.ok and len(results) == 1:
            reply.outputs = results[0]
        elif reply.ok:
            reply.items = results
        batch.replies.append((job.reply_to, reply))
    batch.finish_ms = (time.perf_counter() - clock) * 1000
