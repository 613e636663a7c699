"""The job ledger of the failover and chaos scenarios (benchmarks/ledger.py reads it), loaded by
the stack's processes.

No HTTP answer names its job, so to count jobs lost or answered twice a
scenario puts this folder on the PYTHONPATH of the web and worker processes it
starts, with FAILOVER_LEDGER naming a folder (benchmarks.ledger.environment).
Python imports this module at start-up; it wraps four functions as their
modules load, records job ids, each with the wall-clock time, and changes
nothing else:

- web: Inbox.collect, which the pipeline calls once Redis has acknowledged the
  push of a request's jobs: `queued-<pid>` gets their ids;
- worker: reply.Replier.answer (reply.answer in releases before it), once its
  transaction has been acknowledged:
  `answered-<pid>` gets the ids it answered (bulk items' too, `<job>-<index>`);
  before it, `answering-<pid>` gets the ids of the replies it is about to
  send, so that a worker killed between Redis's acknowledgement and its own
  record is told from a job lost (benchmarks/ledger.py, `unrecorded`);
- worker: batch.decode, which sorts out the jobs taken past their deadline:
  `expired-<pid>` gets the ids it dropped unrun (their clients had a 504);
- worker: queue.left_unrun, the ids of the jobs a take dropped because their
  client had left: `left-<pid>` gets them.

It imports nothing of Funnel's itself: it only wraps what the processes import.
"""

from __future__ import annotations

import functools
import os
import sys
import time

LEDGER = os.environ.get("FAILOVER_LEDGER")


def _record(kind: str, ids: list[str]) -> None:
    # One small append per call: a single write(2), whole, whatever other threads do.
    if not ids:
        return
    stamp = f"{time.time():.3f}"
    with open(os.path.join(LEDGER or ".", f"{kind}-{os.getpid()}"), "a") as out:
        out.write("".join(f"{job_id} {stamp}\n" for job_id in ids))


def _web(inbox) -> None:
    collect = inbox.Inbox.collect

    @functools.wraps(collect)
    async def recorded(self, waiter, job_ids, deadline):
        _record("queued", list(job_ids))
        return await collect(self, waiter, job_ids, deadline)

    inbox.Inbox.collect = recorded


def _worker(reply) -> None:
    replier = getattr(reply, "Replier", None)
    if replier is not None:  # the worker's Replier answers its batches
        answer = replier.answer

        @functools.wraps(answer)
        def recorded(self, replies, *args, **kwargs):
            _record("answering", [one.id for _, one in replies])
            answered = answer(self, replies, *args, **kwargs)
            _record("answered", answered)  # only those still in flight are answered
            return answered

        replier.answer = recorded
        return
    _worker_before_replier(reply)


def _worker_before_replier(reply) -> None:
    """A release whose reply module answers with a function, answer(client, keys, worker_id, model,
    replies, ...) (the upgrade test runs one beside this code)."""
    answer = reply.answer

    @functools.wraps(answer)
    def recorded(client, keys, worker_id, model, replies, *args, **kwargs):
        _record("answering", [one.id for _, one in replies])
        answered = answer(client, keys, worker_id, model, replies, *args, **kwargs)
        _record("answered", answered)  # only those still in flight are answered
        return answered

    reply.answer = recorded  # before funnel.worker.main imports it by name


def _worker_batch(batch) -> None:
    decode = batch.decode

    @functools.wraps(decode)
    def recorded(raws, *args, **kwargs):
        sorted_ = decode(raws, *args, **kwargs)
        if getattr(sorted_, "expired", 0):
            kept = {job.id for job in sorted_.jobs}
            dead = set(map(bytes, sorted_.dead))
            expired = []
            for raw in raws:
                if bytes(raw) in dead:
                    continue
                try:
                    job_id = batch.decode_job(raw).id
                except Exception:  # noqa: BLE001 - the ledger never changes what the worker does
                    continue
                if job_id not in kept:
                    expired.append(job_id)
            _record("expired", expired)
        return sorted_

    batch.decode = recorded  # before prepare (same module) calls it by its global name


def _worker_queue(queue) -> None:
    left_unrun = queue.left_unrun

    @functools.wraps(left_unrun)
    def recorded(ids):
        left = left_unrun(ids)
        _record("left", left)
        return left

    queue.left_unrun = recorded  # JobQueue calls it by its global name


PATCHES = {"funnel.web.queueing.inbox": _web, "funnel.worker.reply": _worker, "funnel.worker.batch": _worker_batch,
           "funnel.worker.queue": _worker_queue}


class _PatchOnImport:
    """A meta path finder that lets the others find a module of PATCHES, then patches it once
    it has run."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def run_and_patch(module, run=run):
                    run(module)
                    try:
                        PATCHES[name](module)
                    except AttributeError:  # a release without that function: nothing of it to record
                        pass

                spec.loader.exec_module = run_and_patch  # type: ignore[method-assign]
                return spec
        return None


if LEDGER:
    sys.meta_path.insert(0, _PatchOnImport())
