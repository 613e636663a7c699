"""One batch: decode the taken jobs, collate, run the model once, split, postprocess.

Failures stay with their own item: a job that does not decode, or is not for
this worker's model and version, goes to the dead-letter list, a job with bad
inputs gets its own error reply, and if the batch as a whole fails to run,
each item is run alone so that only the culprit fails.
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


@dataclass
class Batch:
    jobs: list[Job] = field(default_factory=list)
    replies: list[tuple[str, Reply]] = field(default_factory=list)  # (reply key, reply)
    dead: list[bytes] = field(default_factory=list)
    expired: int = 0
    infer_ms: float = 0.0

    @property
    def errors(self) -> int:
        return sum(not reply.ok for _, reply in self.replies)


def decode(raws: list[bytes], model: str, keys: Keys, worker_id: str, version: int = 1) -> Batch:
    """Sort taken messages into runnable jobs, dead letters and expired jobs (a worker serves one
    version of one model: a job for another is a dead letter, as an undecodable one)."""
    batch = Batch()
    now = now_ms()
    for raw in raws:
        try:
            job = decode_job(raw)
            if job.model != model or job.version != version or not keys.is_reply(job.reply_to, model):
                raise WireError(f"job for model {job.model!r} version {job.version} replying to "
                                f"{job.reply_to!r} does not belong on this queue")
        except WireError as exc:
            log.warning("dead-lettering a job this worker cannot run (%d bytes): %s", len(raw), exc)
            batch.dead.append(raw)
            seen = peek_job(raw)
            if "id" in seen and keys.is_reply(seen.get("reply_to", ""), model):
                batch.replies.append((seen["reply_to"], Reply.failure(
                    seen["id"], "bad_job", f"job could not be decoded: {exc}", worker=worker_id,
                    version=version)))
            continue
        if job.deadline <= now:
            batch.expired += 1  # its client has been answered 504 already
            continue
        batch.jobs.append(job)
    return batch


def split(outputs: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    for name, value in outputs.items():
        if len(value) != n:
            raise RuntimeError(f"model returned {len(value)} rows of {name!r} for {n} inputs")
    return [{name: value[i] for name, value in outputs.items()} for i in range(n)]


def _infer(jobs: list[Job], task: Task, backend: Backend) -> list[dict]:
    """Run the model once per bucket (once, unless the task splits by length); keep job order."""
    inputs = [job.inputs for job in jobs]
    results: list[dict | None] = [None] * len(jobs)
    for group in task.buckets(inputs):
        feeds = task.collate([inputs[i] for i in group])
        for i, row in zip(group, split(backend.run(feeds), len(group))):
            # A raw job (the /v2 protocol's tensors) wants the model's own rows.
            results[i] = row if jobs[i].raw else task.postprocess(row)
    return results  # type: ignore[return-value]


def run(batch: Batch, task: Task, backend: Backend, worker_id: str, version: int = 1) -> None:
    """Answer every job of the batch, appending to batch.replies; each reply names the version
    that computed it."""
    started = now_ms()
    runnable = []
    for job in batch.jobs:
        try:
            task.check(job.inputs)
            runnable.append(job)
        except FunnelError as exc:
            batch.replies.append((job.reply_to, Reply.failure(
                job.id, exc.code, exc.message, worker=worker_id, version=version)))
    if not runnable:
        return
    clock = time.perf_counter()
    try:
        results: list[dict | Exception] = list(_infer(runnable, task, backend))
    except Exception:
        log.exception("batch of %d failed; running its items one by one", len(runnable))
        results = []
        for job in runnable:
            try:
                results.append(_infer([job], task, backend)[0])
            except Exception as exc:  # this item alone is at fault
                results.append(exc)
    infer_ms = batch.infer_ms = (time.perf_counter() - clock) * 1000
    for job, result in zip(runnable, results):
        reply = Reply(id=job.id, ok=True, worker=worker_id, batch_size=len(runnable),
                      queue_ms=max(0, started - job.enqueued), infer_ms=infer_ms, version=version)
        if isinstance(result, Exception):
            reply.ok, reply.error = False, {"code": "inference_failed",
                                            "message": f"{type(result).__name__}: {result}"}
        else:
            reply.outputs = result
        batch.replies.append((job.reply_to, reply))
