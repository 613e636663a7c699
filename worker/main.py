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
A worker serving several models runs the same loop, worker/multiplex.py standing
in for one model's steps (which model to take from, and loading: worker/residency.py).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

from funnel.common import tasks
from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.common.contracts.wire import JOB_FORMAT
from funnel.common.link.connection import connect, on_cluster
from funnel.common.observability import logs, tracing
from funnel.common.result_cache import CachePolicy
from funnel.common.store import ModelSpec, load_spec
from funnel.common.tasks.base import Chain
from funnel.worker import backend as backends
from funnel.worker import batch as batching
from funnel.worker import device as devices
from funnel.worker import warmup
from funnel.worker.allocator import preload_tcmalloc
from funnel.worker.chain import ChainRunner
from funnel.worker.heartbeat import Heartbeat
from funnel.worker.hold import Hold
from funnel.worker.linger import Linger
from funnel.worker.multiplex import Multiplex, Served
from funnel.worker.queue import JobQueue
from funnel.worker.recovery import Recovery
from funnel.worker.reply import Replier
from funnel.worker.residency import Limits, Loaded, Model, Residency, files_mb, is_chain
from funnel.worker.settings import WorkerSettings, model_and_version
from funnel.worker.stages import Slot, Stage
from funnel.worker.stats import Stats
from funnel.worker.steps import BLOCK_S, Steps, retrying
from funnel.worker.webhook import Deliverer

log = logging.getLogger("funnel.worker")


def serve(settings: WorkerSettings, stop: threading.Event) -> None:
    served = settings.served()
    specs = [load_spec(settings.model_store, *model_and_version(m)) for m in served]  # None: the highest now
    if not specs:
        raise SystemExit(f"funnel-worker: no model in {settings.model_store} matches --models {settings.models!r}")
    client = connect(settings.redis_url, socket_timeout=BLOCK_S + 10)
    keys = Keys(settings.prefix, cluster=on_cluster(client))
    device = retrying(lambda: devices.resolve(settings.device, settings.devices, settings.backend,  # auto
                                              client, keys, settings.worker_id), stop)
    if device is None:  # stopped while Redis was down
        return
    recovery = Recovery(client, keys, settings.worker_id, max_attempts=settings.max_attempts,
                        reply_ttl_s=settings.reply_ttl_s)
    hold = Hold(stop, settings.test_hold)
    steps: Steps | Multiplex
    if len(specs) == 1 and not settings.models:
        heartbeat, steps = one_model(settings, specs[0], client, keys, device, recovery, hold, stop)
    else:
        heartbeat, steps = many_models(settings, specs, client, keys, device, recovery, hold, stop)
    retrying(heartbeat.start, stop)
    deliverer = Deliverer(client, keys, settings).start()  # job webhooks, on a thread of their own
    try:
        loop(steps, stop)
    finally:
        deliverer.stop()
        heartbeat.stop()  # after the last reply: a deregistered worker's in-flight jobs are recovered
        tracing.shutdown()  # the spans not yet exported
    log.info("worker %s stopped", settings.worker_id)


def describe(settings: WorkerSettings, spec: ModelSpec, device: str) -> dict:
    """A worker's registry fields for one model version (common/contracts/registry.py's INFO_FIELDS)."""
    return {"model": spec.name, "version": spec.version, "backend": backends.name(spec, settings.backend),
            "device": device,
            "batch_size": settings.batch_size or spec.batch_size, "linger_ms": settings.linger_ms, "lanes": 1,
            "wire": JOB_FORMAT}


def loaded(settings: WorkerSettings, spec: ModelSpec, device: str, client, keys: Keys) -> Loaded:
    """A model version's task and backend, warmed up: before registering, no request meets a cold shape.
    A chain's backend is its runner, which sends its items to its steps' queues."""
    task = tasks.load(spec)
    if isinstance(task, Chain):
        return Loaded(task, ChainRunner(task, client, keys, store=settings.model_store, worker_id=settings.worker_id))
    model = backends.load(spec, settings.backend, device, settings.threads(), settings.spinning, settings.core_lock,
                          settings.tcmalloc)
    warmup.run(task, model, settings.batch_size or spec.batch_size, device)
    return Loaded(task, model)


def steps_for(settings: WorkerSettings, seat: Served, ready: Loaded, device: str, keys: Keys, hold: Hold,
              stop: threading.Event) -> Steps:
    return Steps(settings=settings, task=ready.task, backend=ready.backend, device=device,
                 batch_size=settings.batch_size or seat.spec.batch_size, keys=keys, queue=seat.queue,
                 replier=seat.replier, linger=seat.linger, stats=seat.stats, stop=stop, hold=hold,
                 spans=tracing.Spans("funnel-worker"))


def seat(settings: WorkerSettings, spec: ModelSpec, member: str, stats: Stats, client, keys: Keys, hold: Hold,
         stop: threading.Event) -> Served:
    """A model version's queues and reply lists, for the worker (or its member) `member`."""
    return Served(spec, member, JobQueue(client, keys, model=spec.name, worker_id=member,
                                         bulk_share=settings.bulk_share, version=spec.version),
                  Replier(client, keys, worker_id=member, model=spec.name, ttl_s=settings.reply_ttl_s,
                          version=spec.version, cache_ttl_s=CachePolicy.of(spec.config).ttl_s, hold=hold),
                  Linger(settings.linger_ms, stop), stats)


def one_model(settings: WorkerSettings, spec: ModelSpec, client, keys: Keys, device: str, recovery: Recovery,
              hold: Hold, stop: threading.Event) -> tuple[Heartbeat, Steps]:
    """A worker of one model version: loaded before it registers, and the loop's steps run it alone."""
    started = time.monotonic()
    ready = loaded(settings, spec, device, client, keys)
    heartbeat = Heartbeat(client, keys, settings.worker_id, describe(settings, spec, device), recovery,
                          settings.heartbeat_ttl_s)
    heartbeat.stats.add(loads=1, load_seconds=time.monotonic() - started)
    steps = steps_for(settings, seat(settings, spec, settings.worker_id, heartbeat.stats, client, keys, hold, stop),
                      ready, device, keys, hold, stop)
    log.info("worker %s serving %s version %d (batch %d, linger %g ms) from %s", settings.worker_id,
             spec.name, spec.version, steps.batch_size, settings.linger_ms, keys.queue(spec.name, spec.version))
    return heartbeat, steps


def many_models(settings: WorkerSettings, specs: list[ModelSpec], client, keys: Keys, device: str,
                recovery: Recovery, hold: Hold, stop: threading.Event) -> tuple[Heartbeat, Multiplex]:
    """A worker of several model versions: each registered under its own member id, loaded when work
    waits for it (worker/residency.py), taken from by worker/multiplex.py."""
    members = [registry.member_id(settings.worker_id, spec.name, spec.version) for spec in specs]
    heartbeat = Heartbeat(client, keys, members[0], describe(settings, specs[0], device), recovery,
                          settings.heartbeat_ttl_s)
    for member_id, spec in zip(members[1:], specs[1:]):
        heartbeat.join(member_id, describe(settings, spec, device))
    residency = Residency(client, keys, settings.worker_id,
                          [Model(spec, m.worker_id, m.stats, files_mb(spec), chain=is_chain(spec))
                           for spec, m in zip(specs, heartbeat.members)],
                          Limits(max_resident=settings.max_resident, max_resident_mb=settings.max_resident_mb,
                                 retry_s=settings.load_retry_s, load_timeout_s=settings.load_timeout_s),
                          lambda spec: loaded(settings, spec, device, client, keys), heartbeat.beat)
    heartbeat.live = residency.fields
    seats = [seat(settings, spec, m.worker_id, m.stats, client, keys, hold, stop)
             for spec, m in zip(specs, heartbeat.members)]
    log.info("worker %s serving %d models, at most %s resident: %s", settings.worker_id, len(specs),
             settings.max_resident or "all", ", ".join(f"{s.name}:{s.version}" for s in specs))
    return heartbeat, Multiplex(client, keys, seats, residency,
                                lambda chosen, ready: steps_for(settings, chosen, ready, device, keys, hold, stop),
                                cold_after_s=settings.cold_after_ms / 1000, bulk_share=settings.bulk_share, stop=stop)


def loop(steps: Steps | Multiplex, stop: threading.Event) -> None:
    """Take, collate, run, reply until stopped; returns once every batch taken is answered."""
    collated: Slot[batching.Batch] = Slot()  # the next batch, ready to run
    answering: Slot[batching.Batch] = Slot()  # the last batch run, to be answered

    def take_and_collate() -> None:  # the taker's thread
        while True:
            collated.wait_empty()  # the batch handed over last starts to run now
            if stop.is_set() and not steps.busy():  # busy: a chain's batch still needs its steps taken
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
