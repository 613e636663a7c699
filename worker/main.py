"""The worker daemon: take, collate, run, reply, until told to stop.

The four steps run on three threads, each on a different batch: while this
thread runs one batch on the model, the taker takes and collates the next
and the replier answers the last, so the model never waits on Redis while
work is queued. A batch is handed from one thread to the next through a
`Slot` that holds one: the next batch is taken only once the last one has
started running, and a batch run waits for the replier to take the one before.
Every batch stays in the in-flight list until its replies are written,
whichever thread holds it: a kill at any moment leaves all of them for
recovery, and SIGTERM stops the taking, then runs and answers every batch taken.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from funnel.common import tasks
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import JOB_FORMAT
from funnel.common.link.connection import connect, on_cluster
from funnel.common.observability import logs, tracing
from funnel.common.store import load_spec
from funnel.worker import backend as backends
from funnel.worker import batch as batching
from funnel.worker import device as devices
from funnel.worker import warmup
from funnel.worker.allocator import preload_tcmalloc
from funnel.worker.heartbeat import Heartbeat
from funnel.worker.hold import Hold
from funnel.worker.linger import Linger
from funnel.worker.pipeline import Slot, Stage
from funnel.worker.queue import JobQueue
from funnel.worker.recovery import Recovery
from funnel.worker.reply import Replier
from funnel.worker.settings import WorkerSettings, model_and_version
from funnel.worker.steps import BLOCK_S, Steps, retrying
from funnel.worker.webhook import Deliverer

log = logging.getLogger("funnel.worker")


def serve(settings: WorkerSettings, stop: threading.Event) -> None:
    name, wanted = model_and_version(settings.model)
    spec = load_spec(settings.model_store, name, wanted)  # wanted None: the highest version now
    version = spec.version
    task = tasks.load(spec)
    client = connect(settings.redis_url, socket_timeout=BLOCK_S + 10)
    keys = Keys(settings.prefix, cluster=on_cluster(client))
    device = retrying(lambda: devices.resolve(settings.device, settings.devices, settings.backend,  # auto
                                              client, keys, settings.worker_id), stop)
    if device is None:  # stopped while Redis was down
        return
    model = backends.load(spec, settings.backend, device, settings.threads(), settings.spinning)
    batch_size = settings.batch_size or spec.batch_size
    recovery = Recovery(client, keys, settings.worker_id, settings.max_attempts, settings.reply_ttl_s)
    heartbeat = Heartbeat(client, keys, settings.worker_id, {
        "model": spec.name, "version": version, "backend": settings.backend, "device": device,
        "batch_size": batch_size, "linger_ms": settings.linger_ms, "lanes": 1,
        "wire": JOB_FORMAT},
        recovery, settings.heartbeat_ttl_s)
    hold = Hold(stop, settings.test_hold)
    steps = Steps(settings=settings, task=task, backend=model, device=device, batch_size=batch_size, keys=keys,
                  queue=JobQueue(client, keys, spec.name, settings.worker_id, settings.bulk_share, version),
                  replier=Replier(client, keys, settings.worker_id, spec.name, settings.reply_ttl_s, hold),
                  linger=Linger(settings.linger_ms, stop), stats=heartbeat.stats, stop=stop, hold=hold,
                  spans=tracing.Spans("funnel-worker"))
    warmup.run(task, model, batch_size, device)  # before registering: no request meets a cold shape
    retrying(heartbeat.start, stop)
    deliverer = Deliverer(client, keys, settings).start()  # job webhooks, on a thread of their own
    log.info("worker %s serving %s version %d (batch %d, linger %g ms) from %s", settings.worker_id,
             spec.name, version, batch_size, settings.linger_ms, keys.queue(spec.name, version))
    try:
        loop(steps, stop)
    finally:
        deliverer.stop()
        heartbeat.stop()  # after the last reply: a deregistered worker's in-flight jobs are recovered
        tracing.shutdown()  # the spans not yet exported
    log.info("worker %s stopped", settings.worker_id)


def loop(steps: Steps, stop: threading.Event) -> None:
    """Take, collate, run, reply until stopped; returns once every batch taken is answered."""
    collated: Slot[batching.Batch] = Slot()  # the next batch, ready to run
    answering: Slot[batching.Batch] = Slot()  # the last batch run, to be answered

    def take_and_collate() -> None:  # the taker's thread
        while True:
            collated.wait_empty()  # the batch handed over last starts to run now
            if stop.is_set():
                return
            batch = steps.take_and_collate()
            if batch is not None:
                collated.put(batch)

    def reply() -> None:  # the replier's thread
        for batch in iter(answering.get, None):
            steps.reply(batch)

    taker = Stage("take", take_and_collate, stop, [collated]).start()
    replier = Stage("reply", reply, stop, [answering]).start()
    try:
        for batch in iter(collated.get, None):  # ends once the taker has stopped and its last batch is run
            steps.run(batch)
            if not answering.put(batch):  # the replier has died (its error is raised below)
                break
    finally:
        stop.set()  # whatever ended the loop ends the taker too
        collated.close()
        answering.close()  # the replier answers what it was handed, then ends
        replier.thread.join()
        taker.thread.join()
    replier.join()  # raise what ended either thread
    taker.join()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = WorkerSettings.load(argv)
    if settings.backend == "torch" and settings.device == "cpu" and settings.tcmalloc:
        preload_tcmalloc(argv)
    logs.configure(settings.log_level, settings.log_format)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Stop taking; run and answer every batch taken, then leave: nothing taken is dropped.
        signal.signal(signum, lambda *_: stop.set())
    serve(settings, stop)
    return 0
