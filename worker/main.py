"""The worker daemon: take, collate, run, reply, until told to stop."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from functools import partial

import redis

from funnel.common import tasks
from funnel.common.connection import connect, on_cluster
from funnel.common.keys import Keys
from funnel.common.store import load_spec
from funnel.worker import backend as backends
from funnel.worker import batch as batching
from funnel.worker import device as devices
from funnel.worker.allocator import preload_tcmalloc
from funnel.worker.heartbeat import Heartbeat
from funnel.worker.linger import Linger
from funnel.worker.queue import JobQueue
from funnel.worker.recovery import Recovery
from funnel.worker.reply import answer
from funnel.worker.settings import WorkerSettings, model_and_version
from funnel.worker.webhook import Deliverer

log = logging.getLogger("funnel.worker")
batch_log = logging.getLogger("funnel.worker.batch")

BLOCK_S = 1.0  # longest idle wait, so a stop request is seen within a second
# A Sentinel failover ends within seconds: a worker asleep longer than this after it adds to
# every waiting request, and two tries a second cost a Redis that is down nothing.
MAX_BACKOFF_S = 0.5


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
    model = backends.load(spec, settings.backend, device, settings.intra_op_threads, settings.spinning)
    batch_size = settings.batch_size or spec.batch_size
    queue = JobQueue(client, keys, spec.name, settings.worker_id, settings.bulk_share, version)
    linger = Linger(settings.linger_ms, stop)
    recovery = Recovery(client, keys, settings.worker_id, settings.max_attempts, settings.reply_ttl_s)
    heartbeat = Heartbeat(client, keys, settings.worker_id, {
        "model": spec.name, "version": version, "backend": settings.backend, "device": device,
        "batch_size": batch_size, "linger_ms": settings.linger_ms},
        recovery, settings.heartbeat_ttl_s)
    retrying(heartbeat.start, stop)
    deliverer = Deliverer(client, keys, settings).start()  # job webhooks, on a thread of their own
    log.info("worker %s serving %s version %d (batch %d, linger %g ms) from %s", settings.worker_id,
             spec.name, version, batch_size, settings.linger_ms, keys.queue(spec.name, version))
    try:
        while not stop.is_set():
            raws = retrying(lambda: queue.take(batch_size, linger, BLOCK_S), stop)  # take
            if not raws:
                continue
            batch = batching.decode(raws, spec.name, keys, settings.worker_id, version)
            batching.run(batch, task, model, settings.worker_id, version)          # collate, run
            retrying(partial(answer, client, keys, settings.worker_id, spec.name,   # reply
                             batch.replies, batch.dead, settings.reply_ttl_s), stop, until_done=True)
            linger.observe((len(batch.jobs), batch.infer_ms / 1000), [j.enqueued for j in batch.jobs])
            record(heartbeat.stats, batch, queue.last_wait_s, spec.name, settings.log_batches)
    finally:
        deliverer.stop()
        heartbeat.stop()
    log.info("worker %s stopped", settings.worker_id)


def record(stats, batch: batching.Batch, wait_s: float, model: str, log_it: bool) -> None:
    stats.batch(len(batch.jobs), batch.errors, batch.infer_ms / 1000, wait_s)
    stats.add(expired=batch.expired, dead=len(batch.dead))
    if log_it:
        batch_log.info("batch model=%s size=%d errors=%d expired=%d dead=%d wait_ms=%.1f infer_ms=%.1f",
                       model, len(batch.jobs), batch.errors, batch.expired, len(batch.dead),
                       wait_s * 1000, batch.infer_ms)


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings = WorkerSettings.load(argv)
    if settings.backend == "torch" and settings.device == "cpu" and settings.tcmalloc:
        preload_tcmalloc(argv)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Finish the batch in hand, then leave: nothing taken is dropped.
        signal.signal(signum, lambda *_: stop.set())
    serve(settings, stop)
    return 0
