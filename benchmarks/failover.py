"""Redis Sentinel failover under load: kill -9 the primary and measure what clients see.

    python -m benchmarks.failover [--rounds 3] [--clients 8] [--patient 2] [--before 40] [--after-s 12]
                                  [--down-after-ms 1000]

Starts a primary, a replica and three Sentinels on 127.0.0.1
(scripts/redis_local.py's LocalSentinels: a primary silent for down-after-ms
is down, two Sentinels agree), then the web tier and one text-embedding worker
pointed at them by a redis+sentinel:// URL, and sends requests from `clients`
threads, each a sentence of its own, and from `patient` more through
funnel_client, which retries a 503 as told. Once `before` requests have
succeeded it SIGKILLs the primary, and keeps sending for `after_s`. Per round:
every request's status and time (none may go unanswered past its timeout), the
failover as the Sentinels saw it, the time from the kill to the first success
and to the end of the last failure, answers checked against in-process
inference, and from the job ledger the web and worker keep
(benchmarks/failover_ledger, read by benchmarks/ledger.py) the jobs Redis acknowledged that nobody answered
(lost with the asynchronous replication) and the jobs answered twice. The
table goes to benchmarks/results/failover-<date>.md with the machine;
tests/faults/test_sentinel_failover.py runs one round and asserts on it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks import ledger, save
from benchmarks.machine import cpu_model, loadavg, version
from funnel.common.contracts.keys import Keys
from funnel.common.link.connection import connect, scan_keys
from funnel.scripts.redis_local import LocalSentinels, redis_server_binary, wait_until
from funnel.scripts.stack import Stack
from funnel_client import Client, FunnelHTTPError
from tests.support import http, metric

MODEL = "text-embedding"
LEDGER_PATH = ledger.LEDGER_PATH
REQUEST_TIMEOUT_S = 10  # FUNNEL_REQUEST_TIMEOUT_S: a request waits at most this for its reply
CLIENT_MARGIN_S = 5     # a client gives up this long after the web's deadline: no answer = hung

Embed = Callable[[list[str]], dict[str, np.ndarray]]


@dataclass
class Request:
    text: str
    started: float
    ended: float
    status: int  # 0: no HTTP answer within the client's timeout
    embedding: list[float] | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Round:
    """One failover under load, times in seconds of time.monotonic()."""

    requests: list[Request]
    killed_at: float
    failed_over_at: float            # every Sentinel names the new primary, and it says it is one
    queued: set[str]                 # jobs whose push Redis acknowledged
    answered: collections.Counter    # job id -> answers a worker had acknowledged
    unclaimed: int                   # replies that reached a web process with nobody waiting
    patient: list[Request] = field(default_factory=list)  # funnel_client calls, 503s retried as told
    wrong: int = 0                   # 200s with somebody else's embedding (check_answers)
    notes: dict = field(default_factory=dict)

    @property
    def statuses(self) -> dict[int, int]:
        return dict(sorted(collections.Counter(r.status for r in self.requests).items()))

    @property
    def failures(self) -> list[Request]:
        return [r for r in self.requests if r.status != 200]

    @property
    def failover_s(self) -> float:
        return self.failed_over_at - self.killed_at

    @property
    def first_success_s(self) -> float | None:
        """From the kill to the first 200 of a request sent after it."""
        after = [r.ended for r in self.requests if r.started >= self.killed_at and r.status == 200]
        return min(after) - self.killed_at if after else None

    @property
    def last_failure_s(self) -> float:
        """From the kill to the end of the last failed request."""
        return max((r.ended for r in self.failures), default=self.killed_at) - self.killed_at

    @property
    def recovered_s(self) -> float | None:
        """From the kill until every request answered is a success again: past the last failure
        and the first success (a request may wait between the two, for a worker to reconnect)."""
        first = self.first_success_s
        return None if first is None else max(first, self.last_failure_s)

    @property
    def lost(self) -> set[str]:
        return self.queued - set(self.answered)

    @property
    def answered_twice(self) -> list[str]:
        return [job_id for job_id, n in self.answered.items() if n > 1]

    @property
    def slowest_s(self) -> float:
        return max(r.seconds for r in self.requests)

    @property
    def patient_statuses(self) -> dict[int, int]:
        return dict(sorted(collections.Counter(r.status for r in self.patient).items()))

    @property
    def patient_slowest_s(self) -> float:
        return max((r.seconds for r in self.patient), default=0.0)


def _send(url: str, text: str) -> Request:
    started = time.monotonic()
    try:
        status, body, _ = http("POST", url, json_body={"text": text}, timeout=REQUEST_TIMEOUT_S + CLIENT_MARGIN_S)
    except OSError:  # refused, reset or timed out: no answer
        status, body = 0, {}
    return Request(text, started, time.monotonic(), status, body.get("embedding") if status == 200 else None)


def _call(client: Client, text: str) -> Request:
    """One predict through funnel_client, which retries a 503 after its Retry-After (3 times)."""
    started = time.monotonic()
    try:
        status, body = 200, client.predict(MODEL, text=text)
    except FunnelHTTPError as exc:
        status, body = exc.status or 0, {}
    return Request(text, started, time.monotonic(), status, body.get("embedding"))


def _load(url: str, client: int, until: Callable[[], bool], out: list[Request], patient: bool = False,
          shared: int = 0) -> None:
    """Sentences one after another: sent at once after any answer, or, `patient`, through the
    Python client with its default retries; each client's own, or (shared) every other one of that
    many that every client sends in turn."""
    n = 0
    caller = Client(url.split("/v1/")[0], timeout=REQUEST_TIMEOUT_S + CLIENT_MARGIN_S) if patient else None
    while not until():
        text = (f"shared sentence {(n + client) % shared}: a fox jumps over lazy dogs" if shared and n % 2 == 0 else
                f"{'patient ' if patient else ''}client {client} sentence {n}: a fox jumps over {n % 7} lazy dogs")
        out.append(_call(caller, text) if caller else _send(url, text))
        n += 1


def _ledger(folder: Path) -> tuple[set[str], collections.Counter]:
    read = ledger.read(folder)
    return set(read.queued), read.answered


def _unclaimed(url: str) -> int:
    return int(metric(http("GET", f"{url}/metrics")[1]["_text"], "funnel_replies_unclaimed_total"))


def run(model_store: str | Path, log_dir: Path, clients: int = 8, before: int = 40, after_s: float = 12.0,
        sentinels: LocalSentinels | None = None, down_after_ms: int = 1000, patient: int = 2,
        shared: int = 0) -> Round:
    """One round: a stack on a Sentinel deployment (`sentinels`, started; else a fresh one whose
    Sentinels take a primary silent for down_after_ms as down), load, the kill, the figures.
    shared: every other sentence is one of that many the clients send between them (for a cached
    model: hits, and identical items in flight at once; the others misses), else each its own."""
    folder = Path(tempfile.mkdtemp(prefix="funnel-ledger-"))
    try:
        fresh = contextlib.nullcontext(sentinels) if sentinels else LocalSentinels(down_after_ms=down_after_ms)
        with fresh as deployment:
            return _run(deployment, model_store, log_dir, clients, before, after_s, folder, patient, shared)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(sentinels: LocalSentinels, model_store: str | Path, log_dir: Path, clients: int, before: int,
         after_s: float, folder: Path, patient: int, shared: int) -> Round:
    env = ledger.environment(folder)
    web_env = {**env, "FUNNEL_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
    with Stack(redis_url=sentinels.url, model_store=model_store, models=[MODEL], log_dir=log_dir,
               web_env=web_env, worker_env=env) as stack:
        predict = f"{stack.url}/v1/models/{MODEL}/predict"
        wait_until(lambda: _send(predict, "warm up").status == 200, 30, "a first answer")
        requests: list[Request] = []
        patient_requests: list[Request] = []
        stop_at = [float("inf")]

        def stopping() -> bool:
            return time.monotonic() > stop_at[0]

        threads = [threading.Thread(target=_load, args=(predict, i, stopping, requests, False, shared))
                   for i in range(clients)]
        threads += [threading.Thread(target=_load, args=(predict, i, stopping, patient_requests, True, shared))
                    for i in range(patient)]
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: sum(r.status == 200 for r in requests) >= before, 60,
                       f"{before} answers before the kill")
            old = sentinels.current_primary()
            killed_at = time.monotonic()  # before the signal: a request may fail before kill() returns
            old.kill()
            stop_at[0] = killed_at + after_s
            sentinels.wait_failover(old.port, timeout_s=after_s)
            failed_over_at = time.monotonic()
        finally:
            stop_at[0] = min(stop_at[0], time.monotonic() + after_s)
            for thread in threads:  # each ends within its request's timeout once stop_at has passed
                thread.join(timeout=after_s + REQUEST_TIMEOUT_S + CLIENT_MARGIN_S + 5)
        if any(thread.is_alive() for thread in threads):
            raise TimeoutError("a client thread did not finish: a request hung")
        # Let the worker finish what is still queued, so that only lost jobs stay unanswered.
        client, keys = connect(sentinels.url, socket_timeout=5), Keys()
        wait_until(lambda: client.llen(keys.queue(MODEL)) == 0
                   and not list(scan_keys(client, keys.pattern("inflight"))), 30, "the queue to drain")
        client.close()
        queued, answered = _ledger(folder)
        unclaimed = _unclaimed(stack.url)
    return Round(requests, killed_at, failed_over_at, queued, answered, unclaimed, patient_requests,
                 notes={"clients": clients, "before": before, "after_s": after_s})


def check_answers(round_: Round, embed: Embed) -> int:
    """How many 200s carried an embedding other than their own sentence's."""
    answered = [r for r in round_.requests + round_.patient if r.status == 200]
    expected = embed([r.text for r in answered])
    round_.wrong = sum(r.embedding is None or not np.allclose(r.embedding, expected[r.text], atol=1e-4)
                       for r in answered)
    return round_.wrong


def in_process(model_store: str | Path) -> Embed:
    """Reference embeddings from the same ONNX model, in this process, one sentence at a time."""
    from funnel.common import tasks
    from funnel.common.store import load_spec
    from funnel.worker.backend import load

    spec = load_spec(str(model_store), MODEL)
    model, task = load(spec, "onnx", "cpu"), tasks.load(spec)
    return lambda texts: {t: model.run(task.collate([task.preprocess(t)]))[0]["embedding"] for t in texts}


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def summary(round_: Round) -> str:
    """The round's figures, as a line for a log."""
    return (f"{len(round_.requests)} requests {round_.statuses}; failover {round_.failover_s:.2f} s; failures "
            f"until {round_.last_failure_s:.2f} s, first success {_s(round_.first_success_s)} s, every request "
            f"succeeds from {_s(round_.recovered_s)} s after the kill; slowest {round_.slowest_s:.2f} s; jobs "
            f"queued {len(round_.queued)}, lost {len(round_.lost)}, answered twice {len(round_.answered_twice)}; "
            f"unclaimed replies {round_.unclaimed}; wrong answers {round_.wrong}; through funnel_client "
            f"(retries as told): {len(round_.patient)} calls {round_.patient_statuses}, slowest "
            f"{round_.patient_slowest_s:.2f} s")


def table(rounds: list[Round]) -> str:
    lines = ["| round | requests | 200 | 503 | 504 | no answer | slowest (s) | failover (s) | last failure (s) "
             "| first success (s) | all succeed from (s) | jobs queued | lost | answered twice "
             "| unclaimed replies | wrong | funnel_client calls | failed | slowest (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        s = r.statuses
        lines.append(f"| {i} | {len(r.requests)} | {s.get(200, 0)} | {s.get(503, 0)} | {s.get(504, 0)} "
                     f"| {s.get(0, 0)} | {r.slowest_s:.2f} | {r.failover_s:.2f} | {r.last_failure_s:.2f} "
                     f"| {_s(r.first_success_s)} | {_s(r.recovered_s)} | {len(r.queued)} | {len(r.lost)} "
                     f"| {len(r.answered_twice)} | {r.unclaimed} | {r.wrong} | {len(r.patient)} "
                     f"| {sum(x.status != 200 for x in r.patient)} | {r.patient_slowest_s:.2f} |")
    recovered = [r.recovered_s for r in rounds if r.recovered_s is not None]
    if len(rounds) > 1 and recovered:
        med = statistics.median
        lines += ["", f"Median over {len(rounds)} rounds: failover {med(r.failover_s for r in rounds):.2f} s, "
                  f"every request succeeds again {med(recovered):.2f} s after the kill, "
                  f"{med(len(r.failures) for r in rounds):g} failed requests."]
    return "\n".join(lines)


def redis_version() -> str:
    import subprocess

    out = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "unknown")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--before", type=int, default=40, help="requests answered before the kill")
    parser.add_argument("--patient", type=int, default=2,
                        help="more clients, through funnel_client with its default retries")
    parser.add_argument("--after-s", type=float, default=12.0, help="load after the kill")
    parser.add_argument("--down-after-ms", type=int, default=1000,
                        help="Sentinel's down-after-milliseconds: silence before the primary counts as down")
    parser.add_argument("--store", default="model_store")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (folder printed)")
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="funnel-failover-"))
    embed = in_process(args.store)
    rounds = []
    for i in range(args.rounds):
        round_ = run(args.store, logs / f"round-{i + 1}", args.clients, args.before, args.after_s,
                     down_after_ms=args.down_after_ms, patient=args.patient)
        check_answers(round_, embed)
        rounds.append(round_)
        print(f"round {i + 1}: {summary(round_)}", flush=True)
    stamp = dt.datetime.now()
    report = (f"# Redis Sentinel failover under load, {stamp:%Y-%m-%d %H:%M}\n\n"
              f"Machine: {cpu_model()}, {os.cpu_count()} cores, load {loadavg()}; Python "
              f"{platform.python_version()}, Redis {redis_version()} (primary, replica, 3 Sentinels on 127.0.0.1, "
              f"down-after-milliseconds {args.down_after_ms}, quorum 2), redis-py {version('redis')}; "
              f"`python -m benchmarks.failover --rounds {args.rounds} --clients {args.clients} "
              f"--patient {args.patient} --before {args.before} --after-s {args.after_s:g} "
              f"--down-after-ms {args.down_after_ms}`\n\n"
              f"Web tier (2 processes) and one text-embedding worker, FUNNEL_REQUEST_TIMEOUT_S="
              f"{REQUEST_TIMEOUT_S}; {args.clients} clients send one sentence each at a time, the next as soon "
              f"as the last is answered, and {args.patient} more do the same through funnel_client (its 3 "
              f"retries of a 503, each after Retry-After; their calls are the last three columns); the primary "
              f"is SIGKILLed once {args.before} have been answered. Seconds are counted from the kill.\n\n"
              f"{table(rounds)}\n")
    save("failover", report)
    if args.keep_logs:
        print(f"logs: {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
