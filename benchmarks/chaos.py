"""Chaos soak with a ledger: mixed traffic while processes die, checked against every request.

    python -m benchmarks.chaos [--duration 1200] [--seed 1] [--cluster] [--clients 6] [--bulk-clients 1]
                               [--workers-per-model 2] [--redis-kills N] [--store model_store] [--keep-logs]

Redis behind three Sentinels (scripts/redis_local.py's LocalSentinels: a
primary and a replica), or with --cluster a Redis Cluster of three primaries
each with a replica (LocalCluster(replicas=1)); two web tiers (two `funnel.web`
servers of one process each, on their own ports, the same Redis) behind nginx
(scripts/front_door.py's FrontDoor with both as upstreams, its listening socket
handed from one nginx to the next); `--workers-per-model` workers
for text-embedding and for image-classifier. For `--duration` seconds
(default 20 minutes) clients send /v1 texts and images, /v2 text infers, bulk
jobs (submitted, polled to the end, their results read back) and requests whose
clients hang up before their answer (benchmarks/chaos_load.py), each predict in
a priority lane drawn at random (`X-Priority`), while at random
moments (seeded by --seed, planned up front) one of these happens, one at a time:

- worker-kill: a worker SIGKILLed and a new one started for its model;
- worker-pause: a worker SIGSTOPped (when it holds jobs, if it does within 3 s)
  past its heartbeat TTL, then SIGCONTed;
- web-kill: a web tier's gunicorn master and its process SIGKILLed together,
  then started again on its port;
- redis-kill: the Redis primary SIGKILLed; the Sentinels (the cluster) fail
  over; once every Sentinel has reached the new primary, the old one restarts
  as its replica, and the event ends when that replica is in sync and
  acknowledging writes. The next primary kill waits for the deployment to be
  whole again (REDIS_GAP_S after the last one, the replica in sync and
  acknowledging, every Sentinel counting it and none in TILT): the faults due
  meanwhile go first, and past WHOLE_BOUND_S it is injected anyway, to fail
  naming what was missing;
- nginx-restart: a new nginx started on the same socket beside the old one,
  which quits gracefully.

The web and worker processes keep the job ledger (benchmarks/ledger.py). Once
the traffic stops and the stack has drained, the soak checks: every job Redis
acknowledged was answered, or dropped as expired (its client had a 504) or
because its client had hung up, or dead-lettered past its attempts; none answered twice; every 200 is its own
input's answer (against onnxruntime in this process); no answer came later
than its deadline plus a second; every request that got no HTTP status hung
up on purpose; every acknowledged bulk job completed with each result once and
right; Redis keys without a TTL back to their count before the traffic (keys
with one expire by themselves: counted apart); each process that lived through
the soak within RSS_SLACK of its memory before; every planned fault injected
before the traffic's end. The table goes to
benchmarks/results/chaos-<date>.md (chaos-cluster-... with --cluster), with the
machine; tests/faults/test_chaos.py runs a short round and asserts the checks.
Bulk jobs go to a Redis Cluster as to Sentinel (a job's keys in its own slot,
docs/redis.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import redis

from benchmarks import ledger as ledgers
from benchmarks import save
from benchmarks.chaos_load import CLIENT_MARGIN_S, IMAGE, TEXT, BulkJob, References, Request, Traffic
from benchmarks.machine import cpu_model, loadavg, version
from funnel.common.bulk.job_store import REPLICA_WAIT_MS
from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import connect, scan_keys
from funnel.scripts.front_door import FrontDoor
from funnel.scripts.redis_local import LocalCluster, LocalRedis, LocalSentinels, ask, free_port, wait_until
from funnel.scripts.stack import Stack, get_json

DEADLINE_S = 10.0          # FUNNEL_REQUEST_TIMEOUT_S; a third of the requests ask for 3, 5 or 8 s instead
LATE_SLACK_S = 1.0         # an answer may come this long after its deadline
HEARTBEAT_TTL_S = 5.0      # the workers' (3 s: a 2.3 s failover let live workers' keys expire); a pause lasts
                           # it plus PAUSE_EXTRA_S
PAUSE_EXTRA_S = 2.0
DOWN_AFTER_MS = 1000       # Sentinel: a primary silent this long is down
FAILOVER_TIMEOUT_MS = 5000 # Sentinel: after a failover, none again for twice this
REDIS_GAP_S = 20.0         # so at least this long between two primary kills
SENTINEL_TILT_S = 30.0     # Redis's SENTINEL_TILT_PERIOD: a Sentinel whose timer stalled past 2 s (a starved
                           # process, a clock jump) acts on nothing this long, so a replica it flagged down
                           # stays flagged although it answers
SENTINEL_INFO_S = 10.0     # Redis's SENTINEL_INFO_PERIOD: how often a Sentinel reads a replica's INFO, its link
                           # status, once that replica has reported its link up
WHOLE_BOUND_S = SENTINEL_TILT_S + SENTINEL_INFO_S + 2 * DOWN_AFTER_MS / 1000  # the longest a Sentinel that
                           # stalled once may take to see the deployment as it is: its TILT, an INFO period, a
                           # reconnection and a PING
SYNC_BOUND_S = 60.0        # a killed primary restarted, until it is in sync and acknowledging (a full resync of
                           # the soak's data, docs/failure-contract.md): a starved machine's margin
POLL_S = 0.2               # how often a deferred primary kill asks whether the deployment is whole
RSS_SLACK = (1.5, 64.0)    # a process's RSS after may be up to 1.5 x before + 64 MB
PERIODS_S = {"worker-kill": 60, "worker-pause": 90, "web-kill": 120, "nginx-restart": 120, "redis-kill": 150}
KINDS = tuple(PERIODS_S)
TTL_KINDS_NOTE = "reply lists, worker heartbeats and job records carry a TTL"


@dataclass
class Event:
    kind: str
    planned_s: float          # seconds after the traffic started
    started: float = 0.0      # epoch seconds
    ended: float = 0.0
    detail: str = ""
    error: str = ""
    seconds: float = 0.0      # the figure of the event: failover time, pause length, restart time
    pid: int = 0              # the process it struck (a worker paused or killed)
    back_s: float = 0.0       # a primary kill: from the kill until the old primary, restarted, was a replica in
                              # sync that acknowledged the new primary's writes (no more 503 not_replicated)
    waited_s: float = 0.0     # a primary kill: how long it waited past its moment for the deployment to be whole


def plan(duration_s: float, seed: int, kinds: tuple[str, ...] = KINDS,
         counts: dict[str, int] | None = None) -> list[Event]:
    """Each kind about once per its period (at least once), or `counts[kind]` times, at seeded random
    moments away from the start and the end of the traffic. A count asked of redis-kill spaces its
    moments REDIS_GAP_S apart, so that each primary kill can be injected before the end."""
    rng = random.Random(seed)
    lead, tail = min(10.0, duration_s * 0.1), min(25.0, duration_s * 0.25)
    events = []
    for kind in kinds:
        if counts and kind in counts:
            gap = REDIS_GAP_S if kind == "redis-kill" else 0.0
            span = duration_s - tail - lead - (counts[kind] - 1) * gap
            if span < 0:
                raise ValueError(f"{counts[kind]} of {kind}, {gap:g} s apart, do not fit in {duration_s:g} s")
            moments = sorted(rng.uniform(0.0, span) for _ in range(counts[kind]))
            events += [Event(kind, lead + m + i * gap) for i, m in enumerate(moments)]
            continue
        for _ in range(max(1, round(duration_s / PERIODS_S[kind]))):
            events.append(Event(kind, rng.uniform(lead, duration_s - tail)))
    return sorted(events, key=lambda e: e.planned_s)


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class WebTier:
    """One `funnel.web` server (a gunicorn master and its one process) in a session of its own, so
    that a kill takes both at once."""

    def __init__(self, stack: Stack, name: str, log_dir: Path, env: dict[str, str]):
        self.stack, self.name, self.port, self.log_dir = stack, name, free_port(), log_dir
        self.env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(log_dir / f"metrics-{name}")}
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    def start(self) -> WebTier:
        log = open(self.log_dir / f"{self.name}.log", "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "funnel.web"], env=self.stack.web_environment(
            self.port, **self.env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        def up() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status == 200
            except OSError:
                return False
        wait_until(up, timeout_s, f"web tier {self.name} on {self.port}", alive=self.process)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def pids(self) -> list[int]:
        if not self.process or self.process.poll() is not None:
            return []
        return [self.process.pid, *children(self.process.pid)]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=DEADLINE_S + 10)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Snapshot:
    """Redis and the processes at one moment."""

    keys: dict[str, int]           # kind -> keys
    persistent: dict[str, int]     # kind -> keys without a TTL
    registered: int                # entries of funnel:workers
    dead_letters: int
    redis_memory_mb: float
    rss_mb: dict[str, float]       # role -> RSS (MB) of its processes now
    pids: dict[str, tuple[int, ...]]


@dataclass
class Result:
    mode: str                      # sentinel or cluster
    seed: int
    duration_s: float
    events: list[Event]
    requests: list[Request]
    jobs: list[BulkJob]
    ledger: ledgers.Ledger
    before: Snapshot
    after: Snapshot
    dead_lettered: set[str] = field(default_factory=set)
    drained_s: float = 0.0
    clients_ended: bool = True
    notes: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # role -> times its process was replaced
    log_dir: Path | None = None  # the processes' logs

    # -- interactive requests -------------------------------------------------------------------

    @property
    def outcomes(self) -> dict[str, collections.Counter]:
        table: dict[str, collections.Counter] = {}
        for r in self.requests:
            table.setdefault(r.kind, collections.Counter())[r.outcome] += 1
        return table

    @property
    def wrong(self) -> list[Request]:
        return [r for r in self.requests if r.status == 200 and not r.correct]

    @property
    def unanswered(self) -> list[Request]:
        """Requests sent that got no HTTP status although their client waited for one (a timeout, or
        the connection dropped); a refused connection sent nothing: counted apart (refused)."""
        return [r for r in self.requests if r.status == 0 and r.outcome not in ("hung_up", "refused")]

    @property
    def refused(self) -> list[Request]:
        return [r for r in self.requests if r.outcome == "refused"]

    @property
    def answered(self) -> list[Request]:
        return [r for r in self.requests if r.status]

    @property
    def late(self) -> list[Request]:
        return [r for r in self.answered if r.late_s > LATE_SLACK_S]

    @property
    def slowest(self) -> Request | None:
        return max(self.answered, key=lambda r: r.late_s, default=None)

    # -- the ledger ------------------------------------------------------------------------------

    @property
    def lost(self) -> set[str]:
        return self.ledger.lost - self.dead_lettered - self.unrecorded

    @property
    def unrecorded(self) -> set[str]:
        """Jobs whose worker was killed as it answered them, before it could write the ledger."""
        killed = {e.pid: e.started for e in self.events if e.kind == "worker-kill" and e.pid}
        return self.ledger.unrecorded(killed)

    @property
    def interactive_twice(self) -> list[str]:
        return [j for j in self.ledger.answered_twice if j in self.ledger.queued]

    @property
    def bulk_twice(self) -> list[str]:
        return [j for j in self.ledger.answered_twice if j not in self.ledger.queued]

    def near(self, at: float, kinds: tuple[str, ...], before_s: float, after_s: float) -> Event | None:
        """The event of one of `kinds` whose span, widened by before_s and after_s, holds `at`."""
        return next((e for e in self.events if e.kind in kinds and e.started
                     and e.started - before_s <= at <= (e.ended or e.started) + after_s), None)

    def cause(self, job_id: str) -> str:
        """The fault a job lost or answered twice is put down to: `pause` when one of its answers
        came from a worker paused past its TTL, after its SIGCONT (its jobs had been recovered and
        run by a peer meanwhile); else the event nearest the moment it was queued, within 2 s
        before the event's start and the longest a job lives (deadline + TTL + pause) after its end."""
        for pid, at in self.ledger.answered_by.get(job_id, []):
            if any(e.kind == "worker-pause" and e.pid == pid and e.ended - 0.5 <= at <= e.ended + DEADLINE_S
                   for e in self.events):
                return "pause"
        at = self.ledger.queued.get(job_id) or min(self.ledger.answered_at.get(job_id, [0.0]))
        window = DEADLINE_S + HEARTBEAT_TTL_S + PAUSE_EXTRA_S
        near = [e for e in self.events if e.started and e.started - 2.0 <= at <= (e.ended or e.started) + window]
        return min(near, key=lambda e: abs(at - e.started)).kind if near else "no event"

    def attribute(self, job_ids) -> dict[str, int]:
        return dict(collections.Counter(self.cause(job_id) for job_id in job_ids))

    def unexplained_twice(self) -> list[str]:
        """Jobs answered twice that a primary kill's replication window (the failure contract's
        caveat) does not explain."""
        return [j for j in self.ledger.answered_twice if self.cause(j) != "redis-kill"]

    def evidence(self, job_ids, limit: int = 20) -> str:
        """What the ledger says of each job (queued, answered by which pid and when, dropped) and the
        processes' log lines naming it, for a failed check to show while the logs are at hand."""
        lines = []
        for job_id in sorted(job_ids)[:limit]:
            book = self.ledger
            lines.append(f"{job_id}: queued {book.queued.get(job_id)} answered {book.answered_by.get(job_id, [])} "
                         f"expired {book.expired.get(job_id)} left {book.left.get(job_id)} cause {self.cause(job_id)}")
            for path in sorted(self.log_dir.glob("*.log")) if self.log_dir else []:
                lines += [f"  {path.name}: {line[:300]}" for line in path.read_text(errors="replace").splitlines()
                          if job_id.split("-")[0] in line][:5]
        return "\n".join(lines)

    # -- bulk jobs -------------------------------------------------------------------------------

    @property
    def acknowledged_jobs(self) -> list[BulkJob]:
        return [j for j in self.jobs if j.submit_status == 202]

    @property
    def incomplete_jobs(self) -> list[BulkJob]:
        return [j for j in self.acknowledged_jobs
                if j.state != "done" or j.missing or j.results != len(j.items)]

    def checks(self) -> list[tuple[str, bool, str]]:
        """(invariant, held, figures) for the report and the test."""
        slowest = self.slowest
        lost = self.lost
        unrecorded = f"; {len(self.unrecorded)} answered as their worker was killed, unrecorded" \
            if self.unrecorded else ""
        out = [
            ("no acknowledged job lost", not lost,
             f"{len(self.ledger.queued)} acknowledged, {len(lost)} lost {self.attribute(lost) if lost else ''}"
             f"{unrecorded}"),
            ("none answered twice", not self.ledger.answered_twice,
             f"{len(self.interactive_twice)} interactive, {len(self.bulk_twice)} bulk items "
             f"{self.attribute(self.ledger.answered_twice) if self.ledger.answered_twice else ''}"),
            ("no answer to the wrong request", not self.wrong and not sum(j.wrong for j in self.jobs),
             f"{len(self.wrong)} of {sum(r.status == 200 for r in self.requests)} 200s; "
             f"{sum(j.wrong for j in self.jobs)} bulk results"),
            ("none answered past its deadline + 1 s", not self.late,
             f"{len(self.late)} late; slowest {slowest.late_s:+.2f} s against its deadline "
             f"({slowest.kind}, {slowest.outcome}, deadline {slowest.deadline_s:g} s)" if slowest else "none"),
            ("every request sent answered (but those hung up)", not self.unanswered,
             f"{len(self.unanswered)} without a status: "
             f"{dict(collections.Counter(r.outcome for r in self.unanswered))}"),
            ("no connection refused", not self.refused, f"{len(self.refused)} refused (nothing sent)"),
        ]
        jobs = self.acknowledged_jobs
        out.append(("bulk jobs complete, every result once", not self.incomplete_jobs and not self.bulk_twice
                    and not sum(j.duplicates for j in jobs),
                    f"{len(jobs)} acknowledged, {sum(j.state == 'done' for j in jobs)} done, "
                    f"{len(self.incomplete_jobs)} incomplete "
                    f"{[(j.job_id[:8], j.state, j.results, len(j.items)) for j in self.incomplete_jobs][:5]}, "
                    f"{sum(j.duplicates for j in jobs)} second answers counted by their records"))
        grown = {k: (self.before.persistent.get(k, 0), n) for k, n in self.after.persistent.items()
                 if n > self.before.persistent.get(k, 0)}
        out.append(("Redis keys without a TTL back to their count", not grown and
                    self.after.registered <= self.before.registered,
                    f"grown: {grown or 'none'}; workers listed {self.before.registered} -> {self.after.registered}"))
        swollen = {role: (self.before.rss_mb[role], mb) for role, mb in self.after.rss_mb.items()
                   if role in self.before.rss_mb and self.after.pids.get(role) == self.before.pids.get(role)
                   and mb > self.before.rss_mb[role] * RSS_SLACK[0] + RSS_SLACK[1]}
        out.append(("each long-lived process's memory back near its baseline", not swollen,
                    f"over {RSS_SLACK[0]:g}x + {RSS_SLACK[1]:g} MB: {swollen or 'none'}"))
        out.append(("every event injected", all(e.started and not e.error for e in self.events),
                    "; ".join(f"{e.kind}: {e.error or 'not injected'}" for e in self.events
                              if e.error or not e.started) or f"all {len(self.events)}"))
        return out


class Soak:
    """The deployment, its traffic and its faults; run() returns the Result."""

    def __init__(self, store: str | Path, log_dir: Path, duration_s: float, seed: int, cluster: bool = False,
                 clients: int = 6, bulk_clients: int = 1, workers_per_model: int = 2, pause_s: float = 0.05,
                 kinds: tuple[str, ...] = KINDS, counts: dict[str, int] | None = None):
        self.store, self.log_dir, self.duration_s, self.seed = Path(store).resolve(), log_dir, duration_s, seed
        self.cluster, self.clients, self.bulk_clients = cluster, clients, bulk_clients
        self.workers_per_model, self.pause_s = workers_per_model, pause_s
        self.events = plan(duration_s, seed, kinds, counts)
        self.rng = random.Random(seed + 1)
        self.redis: LocalSentinels | LocalCluster = (LocalCluster(replicas=1) if cluster
                                                      else LocalSentinels(down_after_ms=DOWN_AFTER_MS,
                                                                          failover_timeout_ms=FAILOVER_TIMEOUT_MS))
        self.ledger_dir = log_dir / "ledger"
        self.stack: Stack | None = None
        self.webs: list[WebTier] = []
        self.front: FrontDoor | None = None
        self.workers: list[tuple[str, subprocess.Popen]] = []  # slot -> (model, its current process)
        self.paused: set[int] = set()
        self.restarts: collections.Counter = collections.Counter()
        self.last_redis_kill = -REDIS_GAP_S  # monotonic seconds of the last primary kill
        self.deferred: dict[int, float] = {}  # id of a primary kill -> when it was first found not injectable
        self.stopping = threading.Event()

    # -- the deployment --------------------------------------------------------------------------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.ledger_dir.mkdir(exist_ok=True)
        self.redis.start()
        env = ledgers.environment(self.ledger_dir)
        self.stack = Stack(redis_url=self.redis.url, model_store=self.store, models=[TEXT, IMAGE], workers=[],
                           log_dir=self.log_dir,
                           worker_env={**env, "FUNNEL_HEARTBEAT_TTL_S": f"{HEARTBEAT_TTL_S:g}",
                                       "FUNNEL_INTRA_OP_THREADS": "1", "FUNNEL_SPINNING": "0"},
                           web_env={**env, "FUNNEL_REQUEST_TIMEOUT_S": f"{DEADLINE_S:g}", "FUNNEL_PROCESSES": "1",
                                    "FUNNEL_JOB_TTL_S": "3600",
                                    # an accepted job, bulk or interactive, on a replica before it is answered
                                    "FUNNEL_JOB_REPLICAS": "1"})
        for model in (TEXT, IMAGE):
            for _ in range(self.workers_per_model):
                self.workers.append((model, self.stack.start_worker(model)))
        self.webs = [WebTier(self.stack, name, self.log_dir, {}).start() for name in ("web-a", "web-b")]
        for web in self.webs:
            web.wait_ready()
        self.front = FrontDoor(free_port(), [w.port for w in self.webs], max_body_mb=20.0,
                               timeout_s=DEADLINE_S).start()
        self.wait_workers(120)

    def wait_workers(self, timeout_s: float) -> None:
        def ready() -> bool:
            try:
                listing = get_json(f"http://127.0.0.1:{self.front.port}/v1/models", timeout=5)
            except OSError:
                return False
            live = {m["name"]: len(m["workers"]) for m in listing["models"]}
            return all(live.get(m, 0) >= self.workers_per_model for m in (TEXT, IMAGE))
        wait_until(ready, timeout_s, f"{self.workers_per_model} live workers per model")

    def stop(self) -> None:
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.front:
            self.front.stop()
        for web in self.webs:
            web.stop()
        if self.stack:
            self.stack.stop()  # the workers: SIGTERM, then SIGKILL past 30 s
        if isinstance(self.redis, LocalSentinels):  # their +sdown, -sdown and +tilt lines, beside the others'
            for path in Path(self.redis.dir).glob("sentinel-*.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(path, self.log_dir / path.name)
        self.redis.stop()

    def redis_client(self):
        return connect(self.redis.url, socket_timeout=5)

    # -- what is measured ------------------------------------------------------------------------

    def roles(self) -> dict[str, list[int]]:
        """Each long-lived role and the pids that fill it now."""
        roles: dict[str, list[int]] = {}
        if isinstance(self.redis, LocalSentinels):
            for node in (self.redis.primary, self.redis.replica):
                roles[f"redis :{node.port}"] = [node.process.pid] if node.process else []
            for port, proc in zip(self.redis.sentinel_ports, self.redis.sentinels):
                roles[f"sentinel :{port}"] = [proc.pid]
        else:
            for node in self.redis.nodes:
                roles[f"redis :{node.port}"] = [node.process.pid] if node.process else []
        roles["nginx (master + worker)"] = self.front.pids() if self.front else []
        for web in self.webs:
            roles[f"{web.name} (gunicorn master + process)"] = web.pids()
        for i, (model, proc) in enumerate(self.workers):
            roles[f"worker {i} ({model})"] = [proc.pid]
        return roles

    def snapshot(self) -> Snapshot:
        client = self.redis_client()
        try:
            keys: collections.Counter = collections.Counter()
            persistent: collections.Counter = collections.Counter()
            for key in scan_keys(client, "funnel:*"):
                name = key.decode() if isinstance(key, bytes) else key
                kind = name.split(":")[1] if ":" in name else name
                keys[kind] += 1
                if client.ttl(name) == -1:
                    persistent[kind] += 1
            k = Keys()
            registered = client.hlen(k.workers())
            dead = sum(client.llen(k.dead(m)) for m in (TEXT, IMAGE))
        finally:
            client.close()
        roles = self.roles()
        return Snapshot(dict(keys), dict(persistent), registered, dead, self.redis_memory_mb(),
                        {role: sum(map(rss_kb, pids)) / 1024 for role, pids in roles.items()},
                        {role: tuple(pids) for role, pids in roles.items()})

    def redis_memory_mb(self) -> float:
        nodes = ([self.redis.current_primary()] if isinstance(self.redis, LocalSentinels)
                 else [n for n in self.redis.nodes if ask(n.port, lambda c: c.info("replication"), {}).get("role")
                       == "master"])
        return sum(ask(n.port, lambda c: c.info("memory"), {}).get("used_memory", 0) for n in nodes) / 2 ** 20

    def dead_lettered(self) -> set[str]:
        from funnel.common.contracts.wire import peek_job

        client, k = self.redis_client(), Keys()
        try:
            raws = [raw for m in (TEXT, IMAGE) for raw in client.lrange(k.dead(m), 0, -1)]
        finally:
            client.close()
        return {str(peek_job(raw).get("id", "")) for raw in raws} - {""}

    # -- the faults ------------------------------------------------------------------------------

    def inject(self, event: Event) -> None:
        event.started = time.time()
        try:
            getattr(self, "_" + event.kind.replace("-", "_"))(event)
        except Exception as exc:  # noqa: BLE001 - recorded, reported, and the soak goes on
            event.error = f"{type(exc).__name__}: {exc}"[:300]
        event.ended = event.ended or time.time()

    def _live_workers(self) -> list[int]:
        return [i for i, (_, proc) in enumerate(self.workers) if proc.poll() is None and proc.pid not in self.paused]

    def _worker_kill(self, event: Event) -> None:
        slot = self.rng.choice(self._live_workers())
        model, proc = self.workers[slot]
        proc.kill()
        proc.wait()
        event.pid = proc.pid
        self.workers[slot] = (model, self.stack.start_worker(model))
        self.restarts[f"worker {slot} ({model})"] += 1
        event.detail = f"worker {slot} ({model}) pid {proc.pid}"

    def _worker_pause(self, event: Event) -> None:
        slot = self.rng.choice(self._live_workers())
        model, proc = self.workers[slot]
        client, k = self.redis_client(), Keys()
        held, until = 0, time.monotonic() + 3.0
        worker_id = ""
        try:
            with contextlib.suppress(Exception):  # its id, to catch it holding jobs
                worker_id = next(w for w, m in client.hgetall(k.workers()).items()
                                 if m.decode() == model and int(client.hget(k.worker(model, w.decode()), "pid") or 0)
                                 == proc.pid).decode()
            while True:
                os.kill(proc.pid, signal.SIGSTOP)
                self.paused.add(proc.pid)
                with contextlib.suppress(Exception):
                    held = client.llen(k.inflight(model, worker_id)) if worker_id else 0
                if held or time.monotonic() > until:
                    break
                os.kill(proc.pid, signal.SIGCONT)
                self.paused.discard(proc.pid)
                time.sleep(0.01)
        finally:
            client.close()
        paused_at = time.monotonic()
        time.sleep(HEARTBEAT_TTL_S + PAUSE_EXTRA_S)  # the fault itself: silent past its heartbeat's TTL
        os.kill(proc.pid, signal.SIGCONT)
        self.paused.discard(proc.pid)
        event.pid, event.ended = proc.pid, time.time()
        event.seconds = time.monotonic() - paused_at
        event.detail = f"worker {slot} ({model}) holding {held} jobs"

    def _web_kill(self, event: Event) -> None:
        web = self.rng.choice(self.webs)
        web.kill()
        killed = time.monotonic()
        web.start()
        web.wait_ready()
        self.restarts[f"{web.name} (gunicorn master + process)"] += 1
        event.seconds = time.monotonic() - killed
        event.detail = f"{web.name} on {web.port}"

    def _nginx_restart(self, event: Event) -> None:
        began = time.monotonic()
        self.front.restart()
        self.restarts["nginx (master + worker)"] += 1
        event.seconds = time.monotonic() - began

    def _redis_kill(self, event: Event) -> None:
        missing = self.missing() if event.waited_s > WHOLE_BOUND_S else ""
        if missing:  # deferred that long (_chaos): a kill now would test a deployment still broken
            raise RuntimeError(f"not injected after {event.waited_s:.1f} s of waiting: {missing}")
        began = time.monotonic()
        if isinstance(self.redis, LocalSentinels):
            old = self.redis.current_primary()
            old.kill()
            self.last_redis_kill = time.monotonic()
            new = self.redis.wait_failover(old.port, timeout_s=30)
            event.seconds = time.monotonic() - began
            self.restarts[f"redis :{old.port}"] += 1
            event.detail = f"primary :{old.port} killed; :{new} promoted in {event.seconds:.1f} s"
            # Restarted only once every Sentinel has had a PONG from the new primary: a Sentinel that
            # switched to it reconnects on its own 1 s period, and one that hears nothing from it for
            # down-after-milliseconds flags it down; its peers' votes on the old primary still fresh,
            # that is a quorum at once, and it fails over again, to the old primary just restarted.
            wait_until(lambda: not self._unreached(new), WHOLE_BOUND_S, f"every Sentinel to reach :{new}")
            self._restart_as_replica(old, new)

            def back() -> bool:
                if self.redis.primary_port() == old.port:
                    raise RuntimeError(f"the Sentinels failed over again, to :{old.port} restarted")
                return self._replica_back(old.port, new)
            wait_until(back, SYNC_BOUND_S, f":{old.port} to sync with :{new} and acknowledge its writes",
                       alive=old.process)
            event.back_s = time.monotonic() - began
            event.detail += f"; a replica in sync and acknowledging {event.back_s:.1f} s after the kill"
        else:
            model = self.rng.choice((TEXT, IMAGE))
            old, new = self.redis.kill_primary_of(Keys().queue(model))
            self.last_redis_kill = time.monotonic()
            event.seconds = time.monotonic() - began
            self.restarts[f"redis :{old.port}"] += 1
            self.redis.rejoin(old)
            event.back_s = time.monotonic() - began
            event.detail = (f"primary :{old.port} ({model}'s slot) killed; :{new.port} promoted in "
                            f"{event.seconds:.1f} s; rejoined as replica {event.back_s:.1f} s after the kill")
        if event.waited_s >= POLL_S:
            event.detail += f" (waited {event.waited_s:.1f} s for the deployment to be whole)"

    def _restart_as_replica(self, server: LocalRedis, primary_port: int) -> None:
        """Start a killed data node again as a replica of the primary of now, as LocalSentinels.rejoin
        starts it, without rejoin's waits: the soak waits for what each next step needs itself."""
        args = list(server.args)
        while "--replicaof" in args:  # the primary it started with may be the one just killed
            at = args.index("--replicaof")
            del args[at:at + 3]
        server.args = [*args, "--replicaof", "127.0.0.1", str(primary_port)]
        server.start()

    def _unreached(self, primary_port: int) -> list[int]:
        """The Sentinels that have not had a PONG from this primary since they switched to it: they
        name another, or flag it (disconnected, s_down, ...), or the PING that the switch left
        pending is still unanswered (last-ping-sent is 0 only once a PONG has come)."""
        def reached(port: int) -> bool:
            state = ask(port, lambda c: c.sentinel_master(self.redis.service), {})
            return (int(state.get("port", 0)) == primary_port and state.get("flags") == "master"
                    and state.get("last-ping-sent") == 0)
        return [port for port in self.redis.sentinel_ports if not reached(port)]

    def _replica_back(self, replica_port: int, primary_port: int) -> bool:
        """The replica's link to this primary is up and the primary has a write of its own acknowledged
        by a replica within the web tier's WAIT (REPLICA_WAIT_MS): what a job needs to be accepted."""
        info = ask(replica_port, lambda c: c.info("replication"), {})
        if info.get("master_link_status") != "up" or int(info.get("master_port", 0)) != primary_port:
            return False
        try:
            with redis.Redis(port=primary_port, socket_timeout=REPLICA_WAIT_MS / 1000 + 2,
                             socket_connect_timeout=1) as client:
                client.set("chaos:replica-probe", 1, ex=60)  # WAIT counts its own connection's writes
                return client.wait(1, REPLICA_WAIT_MS) >= 1
        except redis.RedisError:
            return False

    def missing(self) -> str:
        """What the deployment lacks for another primary kill, "" when nothing: behind Sentinel, a
        primary all Sentinels name, its replica in sync and acknowledging, and every Sentinel out of
        TILT counting that replica as live (not s_down, connected, its link ok: what the failover's
        leader, whichever it is, needs to pick it); on a cluster, every node a primary or a replica in sync."""
        if isinstance(self.redis, LocalCluster):
            unsettled = [node.port for node in self.redis.nodes if not self.redis.settled(node)]
            return f"nodes {unsettled} neither a primary nor a replica in sync" if unsettled else ""
        primary = self.redis.primary_port()
        if primary is None:
            return "the Sentinels do not agree on a primary"
        replica = next(node for node in (self.redis.primary, self.redis.replica) if node.port != primary)
        if not self._replica_back(replica.port, primary):
            return f"replica :{replica.port} not in sync with :{primary} or not acknowledging its writes"
        views = []
        for port in self.redis.sentinel_ports:
            tilt = ask(port, lambda c: c.info("sentinel"), {}).get("sentinel_tilt")
            entry = next((r for r in ask(port, lambda c: c.sentinel_slaves(self.redis.service), [])
                          if int(r.get("port", 0)) == replica.port), None)
            counted = entry is not None and entry.get("master-link-status") == "ok" and not any(
                entry.get(flag) for flag in ("is_sdown", "is_odown", "is_disconnected"))
            if tilt != 0 or not counted:
                seen = f"{entry.get('flags')}, link {entry.get('master-link-status')}" if entry else "not listed"
                views.append(f"Sentinel :{port} ({'TILT' if tilt else 'no answer' if tilt is None else 'acting'}) "
                             f"sees :{replica.port} as {seen}")
        return "; ".join(views)

    def _injectable(self, event: Event, due_s: float) -> bool:
        """Whether `event`, due since due_s (monotonic), goes now: any but a primary kill at once; a
        primary kill REDIS_GAP_S after the last one, once the deployment is whole, or once it has
        waited WHOLE_BOUND_S for that (then it fails, naming what was missing)."""
        if event.kind != "redis-kill":
            return True
        now = time.monotonic()
        if now < max(due_s, self.last_redis_kill + REDIS_GAP_S):
            return False
        whole = not self.missing()
        event.waited_s = now - self.deferred.setdefault(id(event), now)
        return whole or event.waited_s > WHOLE_BOUND_S

    def _chaos(self, began: float) -> None:
        """The plan's events one at a time, each at its moment or, if it cannot go yet (a primary
        kill: _injectable), as soon after as it can, the events due meanwhile going first."""
        pending = list(self.events)
        while pending and not self.stopping.is_set():
            now = time.monotonic()
            due = [e for e in pending if began + e.planned_s <= now]
            if not due:
                self.stopping.wait(began + pending[0].planned_s - now)
                continue
            event = next((e for e in due if self._injectable(e, began + e.planned_s)), None)
            if event is None:
                self.stopping.wait(POLL_S)
                continue
            pending = [e for e in pending if e is not event]
            self.inject(event)
        for event in pending:  # the traffic ended first
            missing = self.missing() if event.kind == "redis-kill" else ""
            event.error = "not injected before the traffic's end" + (f": {missing}" if missing else "")

    # -- the run ---------------------------------------------------------------------------------

    def warm_up(self, refs: References) -> None:
        """Every kind of request through each web tier and through nginx, so that the baseline is taken
        after first-use allocations: all must be right."""
        for port in [w.port for w in self.webs] + [self.front.port]:
            traffic = Traffic(port, refs, self.seed, DEADLINE_S)
            rng = random.Random(self.seed)
            for kind in ("v1-text", "v1-texts", "v1-image", "v2-text") * 3:
                request = traffic._one(kind, DEADLINE_S, rng)
                if request.status != 200 or not request.correct:
                    raise RuntimeError(f"warm-up {kind} through {port}: {request}")
            for model in (TEXT, IMAGE):
                job = BulkJob(model, refs.texts[:16] if model == TEXT else [0, 1], time.time())
                traffic._run_job(job)
                if job.state != "done" or job.wrong or job.missing:
                    raise RuntimeError(f"warm-up bulk job through {port}: {job}")
        # Then bursts, so that every worker runs full batches (ONNX Runtime's arena grows to the
        # largest batch it has run) before the baseline is taken.
        traffic = Traffic(self.front.port, refs, self.seed, DEADLINE_S)
        kinds = ["v1-image"] * 48 + ["v1-texts"] * 48 + ["v2-text"] * 16
        for _ in range(2):
            with ThreadPoolExecutor(max_workers=24) as pool:
                done = list(pool.map(lambda i: traffic._one(kinds[i], DEADLINE_S, random.Random(i)),
                                     range(len(kinds))))
            answered = [r for r in done if r.status == 200]
            if any(not r.correct for r in answered) or len(answered) < len(done) / 2:
                raise RuntimeError(f"warm-up burst: {collections.Counter(r.outcome for r in done)}")

    def drain(self, timeout_s: float = 120.0) -> float:
        """Until nothing is queued or in flight, and every worker listed is alive (dead ones recovered)."""
        began, k = time.monotonic(), Keys()

        def idle() -> bool:
            client = self.redis_client()
            try:
                busy = any(True for kind in ("queue", "bulk", "inflight", "recovering")
                           for _ in scan_keys(client, k.pattern(kind)))
                listed = client.hgetall(k.workers())
                live = sum(bool(client.exists(k.worker(m.decode(), w.decode()))) for w, m in listed.items())
                return not busy and live == len(listed) == len(self.workers)
            except Exception:  # noqa: BLE001 - Redis settling: ask again
                return False
            finally:
                client.close()
        wait_until(idle, timeout_s, "the queues to drain and dead workers to be recovered")
        return time.monotonic() - began

    def run(self, refs: References) -> Result:
        notes = []
        try:
            self.start()
            self.warm_up(refs)
            self.wait_workers(60)
            before = self.snapshot()
            traffic = Traffic(self.front.port, refs, self.seed, DEADLINE_S, self.clients, self.bulk_clients,
                              self.pause_s).start()
            began = time.monotonic()
            chaos = threading.Thread(target=self._chaos, args=(began,), name="chaos", daemon=True)
            chaos.start()
            self.stopping.wait(self.duration_s)
            self.stopping.set()  # no new event; one under way finishes
            chaos.join(timeout=120)
            if chaos.is_alive():
                notes.append("an event was still under way 120 s after the traffic's end")
            for event in self.events:
                if not event.started and not event.error:
                    event.error = "not injected before the traffic's end"
            ended = traffic.finish(timeout_s=240)
            if not ended:
                notes.append("a client was still waiting 240 s after the traffic's end")
            drained = self.drain()
            after = self.snapshot()
            dead = self.dead_lettered()
            _duplicates(self, traffic.jobs)
        finally:
            self.stop()
        return Result("cluster" if self.cluster else "sentinel", self.seed, self.duration_s, self.events,
                      traffic.requests, traffic.jobs, ledgers.read(self.ledger_dir), before, after, dead,
                      drained_s=drained, clients_ended=ended, notes=notes,
                      restarts=dict(self.restarts), log_dir=self.log_dir)


def _duplicates(soak: Soak, jobs: list[BulkJob]) -> None:
    """Each job record's count of second answers (stored once, counted, never shown in a status)."""
    client, k = soak.redis_client(), Keys()
    try:
        for job in jobs:
            if job.job_id:
                job.duplicates = int(client.hget(k.job(job.job_id), "duplicates") or 0)
    finally:
        client.close()


def _mb(value: float) -> str:
    return f"{value:.1f}"


def report(result: Result, command: str, elapsed_s: float) -> str:
    lines = []
    add = lines.append
    by_kind = collections.Counter(e.kind for e in result.events)
    add("## Events injected\n")
    add("| event | injected | failed to inject | seconds (min / median / max) | what |")
    add("|---|---|---|---|---|")
    for kind in KINDS:
        events = [e for e in result.events if e.kind == kind and e.started]
        failed = sum(bool(e.error) or not e.started for e in result.events if e.kind == kind)
        seconds = sorted(e.seconds for e in events if e.seconds)
        what = {"worker-kill": "SIGKILL, a new worker started", "worker-pause":
                f"SIGSTOP past the {HEARTBEAT_TTL_S:g} s heartbeat TTL (seconds paused), SIGCONT",
                "web-kill": "gunicorn master + process SIGKILLed, started again (seconds to healthy)",
                "nginx-restart": "new nginx on the same socket, the old one quitting gracefully (seconds)",
                "redis-kill": "primary SIGKILLed (seconds to the promotion), rejoined as replica; from the kill "
                              "until a replica was in sync and acknowledging: "
                              + _spread(sorted(e.back_s for e in events if e.back_s)) + " s"}[kind]
        add(f"| {kind} | {sum(not e.error for e in events)} of {by_kind[kind]} | {failed} | {_spread(seconds)} "
            f"| {what} |")
    add("\n## Requests by outcome\n")
    outcomes = result.outcomes
    columns = sorted({o for c in outcomes.values() for o in c}, key=lambda o: (not o.isdigit(), o))
    add("| kind | sent | " + " | ".join(columns) + " | wrong |")
    add("|---|---|" + "---|" * len(columns) + "---|")
    total: collections.Counter = collections.Counter()
    for kind, counts in sorted(outcomes.items()):
        total.update(counts)
        wrong = sum(1 for r in result.wrong if r.kind == kind)
        add(f"| {kind} | {sum(counts.values())} | " + " | ".join(str(counts.get(c, 0)) for c in columns)
            + f" | {wrong} |")
    add(f"| all | {sum(total.values())} | " + " | ".join(str(total.get(c, 0)) for c in columns)
        + f" | {len(result.wrong)} |")
    errors = collections.Counter((r.status, r.error) for r in result.requests if r.status not in (0, 200))
    if errors:
        add("\nError answers by status and code: " + ", ".join(
            f"{status} `{code or '-'}` {n}" for (status, code), n in sorted(errors.items())) + ".")
    unreplicated = [r for r in result.requests if r.status == 503 and ("not_replicated" in r.error
                                                                        or "replica(s)" in r.error)]
    if unreplicated:
        kills = sorted(e.started for e in result.events if e.kind == "redis-kill" and e.started)
        after = sorted(r.ended - max((k for k in kills if k <= r.started), default=float("nan"))
                       for r in unreplicated)
        add(f"\n503 `not_replicated` (the job not on a replica within the web's `WAIT`): {len(unreplicated)}, "
            f"answered {_spread(after)} s (min / median / max) after the primary kill before them.")
    jobs = result.jobs
    states = collections.Counter(j.state for j in result.acknowledged_jobs)
    add(f"\nBulk jobs: {len(jobs)} submitted, submit statuses "
        f"{dict(collections.Counter(j.submit_status for j in jobs))}; the acknowledged ended {dict(states)}; "
        f"{sum(len(j.items) for j in result.acknowledged_jobs)} items, "
        f"{sum(j.results for j in result.acknowledged_jobs)} results read back, "
        f"{sum(j.failed_items for j in result.acknowledged_jobs)} of them item errors.")
    add("\n## Checks\n")
    add("| check | held | figures |")
    add("|---|---|---|")
    for name, held, figures in result.checks():
        add(f"| {name} | {'yes' if held else '**NO**'} | {figures} |")
    led = result.ledger
    add(f"\nLedger: {len(led.queued)} interactive jobs acknowledged by Redis, {len(led.answered)} job ids answered "
        f"(bulk items included), {len(led.expired)} dropped unrun past their deadline (their clients had a 504), "
        f"{len(led.left)} dropped unrun because their clients had hung up, "
        f"{len(result.dead_lettered)} dead-lettered past their attempts.")
    add("\n## Redis and memory, before the traffic and after it drained\n")
    add(f"Drained {result.drained_s:.1f} s after the clients ended. Keys with a TTL expire by themselves "
        f"({TTL_KINDS_NOTE}): the check is on the keys without one.\n")
    add("| Redis keys (kind) | before | after | without a TTL: before | after |")
    add("|---|---|---|---|---|")
    for kind in sorted(set(result.before.keys) | set(result.after.keys)):
        add(f"| {kind} | {result.before.keys.get(kind, 0)} | {result.after.keys.get(kind, 0)} "
            f"| {result.before.persistent.get(kind, 0)} | {result.after.persistent.get(kind, 0)} |")
    add(f"| workers listed (funnel:workers) | {result.before.registered} | {result.after.registered} | | |")
    add(f"| dead letters | {result.before.dead_letters} | {result.after.dead_letters} | | |")
    add(f"| used_memory (MB, primaries) | {_mb(result.before.redis_memory_mb)} | {_mb(result.after.redis_memory_mb)} "
        f"| | |")
    add("\n| process | RSS before (MB) | after (MB) | change | replaced during the soak (times) |")
    add("|---|---|---|---|---|")
    for role in result.before.rss_mb:
        before, after = result.before.rss_mb[role], result.after.rss_mb.get(role, 0.0)
        add(f"| {role} | {_mb(before)} | {_mb(after)} | {after - before:+.1f} "
            f"| {result.restarts.get(role, 0) or ''} |")
    twice = result.ledger.answered_twice
    if twice:
        start = min((r.started for r in result.requests), default=0.0)
        add("\n## Jobs answered twice\n")
        add("| job | queued at (s) | answers: worker pid at (s) | put down to |")
        add("|---|---|---|---|")
        for job_id in twice[:20]:
            queued = result.ledger.queued.get(job_id)
            answers = ", ".join(f"{pid} at {at - start:.2f}" for pid, at in result.ledger.answered_by[job_id])
            add(f"| {job_id[:12]} | {'-' if queued is None else f'{queued - start:.2f}'} | {answers} "
                f"| {result.cause(job_id)} |")
    if result.notes:
        add("\nNotes: " + "; ".join(result.notes) + ".")
    add("\n## Events in order\n")
    add("| at (s) | event | seconds | what | error |")
    add("|---|---|---|---|---|")
    start = min((r.started for r in result.requests), default=0.0)
    for e in sorted(result.events, key=lambda e: e.started or float("inf")):  # a deferred kill goes later
        at = f"{e.started - start:.1f}" if e.started else f"- (planned {e.planned_s:.1f})"
        add(f"| {at} | {e.kind} | {e.seconds:.1f} | {e.detail} | {e.error} |")
    return "\n".join(lines) + "\n"


def _spread(values: list[float]) -> str:
    """min / median / max of sorted values, "-" for none."""
    return f"{values[0]:.1f} / {values[len(values) // 2]:.1f} / {values[-1]:.1f}" if values else "-"


def header(result: Result, command: str, elapsed_s: float, clients: int, bulk_clients: int, workers: int) -> str:
    from benchmarks.failover import redis_version

    cluster = result.mode == "cluster"
    deployment = ("Redis Cluster: 3 primaries, each with a replica (cluster-node-timeout 2 s)" if cluster
                  else f"Redis primary + replica behind 3 Sentinels (down-after-milliseconds {DOWN_AFTER_MS}, "
                       f"failover-timeout {FAILOVER_TIMEOUT_MS} ms, quorum 2)")
    return (f"# Chaos soak ({result.mode}), {time.strftime('%Y-%m-%d %H:%M')}\n\n"
            f"Machine: {cpu_model()}, {os.cpu_count()} cores, load {loadavg()} at the end; Python "
            f"{platform.python_version()}, Redis {redis_version()}, redis-py {version('redis')}, onnxruntime "
            f"{version('onnxruntime')}. `{command}`: {result.duration_s:g} s of traffic, seed {result.seed}, "
            f"{elapsed_s:.0f} s in all.\n\n"
            f"{deployment}; two web tiers (`funnel.web`, one process each) behind nginx; {workers} workers each for "
            f"text-embedding and image-classifier (heartbeat TTL {HEARTBEAT_TTL_S:g} s). FUNNEL_REQUEST_TIMEOUT_S="
            f"{DEADLINE_S:g}, half the requests asking for 3, 5 or 8 s (`X-Request-Timeout`); {clients} clients "
            f"(/v1 text, texts, image; /v2 text; hang-ups after 20-300 ms)"
            f"; {bulk_clients} bulk-job client(s). "
            f"Each client waits {CLIENT_MARGIN_S:g} s past its deadline; a status-less end is `refused`, "
            f"`reset`, `timeout` or `hung_up` (on purpose).\n\n")


def soak(store: str | Path, duration_s: float, seed: int, cluster: bool = False, clients: int = 6,
         bulk_clients: int = 1, workers_per_model: int = 2, log_dir: Path | None = None,
         refs: References | None = None, kinds: tuple[str, ...] = KINDS,
         counts: dict[str, int] | None = None) -> Result:
    """One soak; the logs and the ledger go to log_dir (a temporary folder, removed, if None)."""
    folder = log_dir or Path(tempfile.mkdtemp(prefix="funnel-chaos-"))
    refs = refs or References(store)
    runner = Soak(store, folder, duration_s, seed, cluster, clients, bulk_clients, workers_per_model, kinds=kinds,
                  counts=counts)
    try:
        result = runner.run(refs)
        dump(result, folder)
        return result
    finally:
        if log_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


def dump(result: Result, folder: Path) -> None:
    """Every request and event as JSON Lines beside the logs, for a closer look (--keep-logs)."""
    with open(folder / "requests.jsonl", "w") as out:
        for r in result.requests:
            out.write(json.dumps(dataclasses.asdict(r)) + "\n")
    with open(folder / "events.jsonl", "w") as out:
        for e in result.events:
            out.write(json.dumps(dataclasses.asdict(e)) + "\n")
    with open(folder / "jobs.jsonl", "w") as out:
        for j in result.jobs:
            out.write(json.dumps({k: v for k, v in dataclasses.asdict(j).items() if k != "items"}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of traffic (default 20 minutes)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the events' moments and the traffic")
    parser.add_argument("--cluster", action="store_true", help="a Redis Cluster instead of Sentinel")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--bulk-clients", type=int, default=1)
    parser.add_argument("--workers-per-model", type=int, default=2)
    parser.add_argument("--redis-kills", type=int, metavar="N",
                        help=f"plan N primary kills, {REDIS_GAP_S:g} s apart or more (default: one per "
                             f"{PERIODS_S['redis-kill']} s of traffic), e.g. 4 in a 150 s run")
    parser.add_argument("--store", default="model_store")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs and the ledger")
    args = parser.parse_args(argv)
    counts = {"redis-kill": args.redis_kills} if args.redis_kills else None
    try:
        plan(args.duration, args.seed, counts=counts)
    except ValueError as exc:
        parser.error(str(exc))
    began = time.monotonic()
    logs = Path(tempfile.mkdtemp(prefix="funnel-chaos-"))
    result = soak(args.store, args.duration, args.seed, args.cluster, args.clients, args.bulk_clients,
                  args.workers_per_model, log_dir=logs, counts=counts)
    command = "python -m benchmarks.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    elapsed = time.monotonic() - began
    text = header(result, command.strip(), elapsed, args.clients, args.bulk_clients, args.workers_per_model)
    save("chaos-cluster" if args.cluster else "chaos", text + report(result, command, elapsed))
    if args.keep_logs:
        print(f"logs and ledger: {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 0 if all(held for _, held, _ in result.checks()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
