"""Keeping an accelerator busy: Funnel's workers against a paced model, and what everything else costs.

    python -m benchmarks.accelerator [--duration 10] [--rounds 1] [--batch-ms 2] [--item-ms 0.01] \
        [--clients-single 128] [--clients-batch 16] [--before DIR]

Run from the repository root. The model is the toy scorer of
tests/third_party/toyscore (4 numbers in, 3 scores out) in batches of 32,
its worker's backend paced like an accelerator (benchmarks/paced_worker.py:
each run takes --batch-ms plus --item-ms per item, asleep, so it costs no
CPU; the defaults are the text model's figures on an H100). For one and two
workers (each its own paced accelerator), with single-item requests and
32-item requests, a stack (private Redis, the web tier with its default
settings, the workers) is started, warmed, and loaded with wrk for
--duration seconds. Each point reports:

- busy: the share of the wall time the accelerators spent running batches
  (time in run, counted by each worker's paced backend, over workers x
  seconds);
- items/s against the paced ceiling (batches of 32, back to back, on every
  accelerator);
- the CPU per request and per item of the web tier, the workers and Redis,
  from /proc/<pid>/stat of each process tree before and after the run; the
  workers' outside the model: the toy graph (run on one intra-op thread, so
  that its pool does not spin between runs as an accelerator's would not) is
  the accelerator's stand-in, and the CPU its runs took, counted by the paced
  backend, is shown apart and not counted;
- beside them, the bare ASGI floor: a trivial ASGI app under the same
  gunicorn settings answering a constant to the same bodies
  (benchmarks/peers/bare_asgi.py); and after each point, the CPU of a Redis
  round trip from Python (client and Redis), of which a 32-item request
  makes four: the floor its queueing cannot go under.

--before DIR (a checkout of an older Funnel, e.g. `git worktree add
/tmp/before <commit>`) runs every point a second time with that checkout's
worker (its worker/ folder, the rest this checkout's), in the same run, the
order alternating, so that the table holds both. Saves the table under
benchmarks/results/accelerator-<date>.md with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from benchmarks import ROOT, commit_of, save
from benchmarks.core import machine
from benchmarks.cpu import cpu_seconds, cpu_ticks, machine_busy_s
from benchmarks.load import write_lua, wrk
from benchmarks.payloads import Payload
from benchmarks.web_cpu import bare, wait_for_answer
from funnel.common.link.line import Line
from funnel.scripts.stack import Stack
from tests import toy_model

MODEL = "toy-score"
BATCH = 32
THIRD_PARTY = str(toy_model.PACKAGE_DIR)


def body(items: int) -> Payload:
    vectors = toy_model.vectors(items, seed=11)
    text = f'{{"input": {vectors[0]}}}' if items == 1 else f'{{"inputs": {vectors}}}'
    return Payload(text.encode(), "application/json", f"{items} item{'s' if items > 1 else ''}")


def store(work: Path) -> Path:
    """A model store holding the toy scorer in batches of BATCH."""
    path = work / "store"
    path.mkdir()
    done = toy_model.add_toy(path, work, MODEL, "toyscore.tasks:VectorScore", "--batch-size", str(BATCH))
    if done.returncode != 0:
        raise SystemExit(f"funnel add failed: {done.stderr}")
    return path


def link_tree(before: Path, work: Path) -> Path:
    """A folder that puts `before`'s worker, and the common package it was written against, with this
    checkout's other packages first on PYTHONPATH (the worker process imports nothing of web/)."""
    tree = work / "before-path"
    (tree / "funnel").mkdir(parents=True)
    for package in ("web", "scripts"):
        (tree / "funnel" / package).symlink_to(ROOT / package, target_is_directory=True)
    for package in ("worker", "common"):
        (tree / "funnel" / package).symlink_to(before.resolve() / package, target_is_directory=True)
    return tree


@contextlib.contextmanager
def paced_stack(model_store: Path, workers: int, pace: dict[str, str], worker_path: Path | None, log_dir: Path):
    env = {"PYTHONPATH": THIRD_PARTY}
    (log_dir / "ledger").mkdir(exist_ok=True)
    worker_env = {**pace, "PACE_LEDGER": str(log_dir / "ledger"), "FUNNEL_INTRA_OP_THREADS": "1",
                  "PYTHONPATH": os.pathsep.join([*([str(worker_path)] if worker_path else []), str(ROOT), THIRD_PARTY])}
    with Stack(model_store=model_store, models=[MODEL], workers=[], web_env=env, log_dir=log_dir) as stack:
        for i in range(workers):
            out = open(log_dir / f"paced-worker-{i}.log", "ab")
            stack.workers.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.paced_worker"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                env=stack.worker_environment(MODEL, **worker_env)))
        stack.wait_ready(60, expected={MODEL: workers})
        yield stack


def in_run(workers: list[subprocess.Popen], ledger: Path) -> list[float]:
    """Each paced worker's totals (seconds in run, runs, items, the model's CPU seconds), summed:
    asked for with a file (benchmarks/paced_worker.py)."""
    totals = [0.0, 0.0, 0.0, 0.0]
    for worker in workers:
        path = ledger / str(worker.pid)
        path.unlink(missing_ok=True)
        (ledger / f"{worker.pid}.ask").touch()
        deadline = time.monotonic() + 10
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker.pid} (exit status {worker.poll()}) wrote no ledger")
            time.sleep(0.001)
        totals = [t + float(v) for t, v in zip(totals, path.read_text().split())]
    return totals


def point(url: str, groups: dict[str, list[int]], payload: Payload, clients: int, duration_s: float,
          work: Path, paced: list[subprocess.Popen] = ()) -> dict:
    """One wrk run: its figures, the CPU seconds of each group, and the paced workers' time in run."""
    script = write_lua(work, "body", payload)
    with open(work / "wrk.log", "a") as log:
        wrk(url, script, clients, 2, log)  # warm-up, not recorded
        time.sleep(0.5)  # settle: what the warm-up queued is done
        before_run = in_run(paced, work / "ledger")
        before, busy = cpu_ticks(groups), machine_busy_s()
        result = wrk(url, script, clients, duration_s, log)
        spent = cpu_seconds(before, cpu_ticks(groups))
        result["other_cores"] = max(0.0, machine_busy_s() - busy - sum(spent.values())) / result["seconds"]
        after_run = in_run(paced, work / "ledger")
    result["in_run"] = [a - b for a, b in zip(after_run, before_run)]  # seconds, runs, items, model CPU s
    if result["non2xx"] or result["socket_errors"]:
        raise RuntimeError(f"errors under load: {result}")
    if paced:  # the accelerator's stand-in is not the worker's cost
        result["model_cpu"] = result["in_run"][3]
        spent["worker"] -= result["model_cpu"]
    result["cpu"] = spent
    return result


def measure(args, model_store: Path, work: Path, code: str, worker_path: Path | None, workers: int,
            items: int) -> dict:
    pace = {"PACE_BATCH_MS": str(args.batch_ms), "PACE_ITEM_MS": str(args.item_ms)}
    clients = args.clients_single if items == 1 else args.clients_batch
    with paced_stack(model_store, workers, pace, worker_path, work) as stack:
        groups = {"worker": [p.pid for p in stack.workers], "web": [stack.web.pid],
                  "redis": [stack.redis.process.pid]}
        result = point(f"{stack.url}/v1/models/{MODEL}/predict", groups, body(items), clients, args.duration,
                       work, stack.workers)
        result["round_trip"] = round_trip(stack)
    busy_s, runs, run_items, _ = result["in_run"]
    ceiling = workers * BATCH / ((args.batch_ms + args.item_ms * BATCH) / 1000)
    return {**result, "code": code, "workers": workers, "items": items, "clients": clients,
            "items_s": result["rps"] * items, "ceiling": ceiling, "busy": busy_s / (workers * result["seconds"]),
            "mean_batch": run_items / max(runs, 1)}


def round_trip(stack: Stack, count: int = 20000) -> tuple[float, float]:
    """The CPU of one Redis round trip from Python, PING after PING on a thread's own connection
    (common/link/line.py, as the web's outbox and inbox and the worker's scripts make theirs): µs of
    the client, µs of Redis."""
    line = Line(redis.Redis.from_url(stack.redis_url))
    line.exchange([("PING",)])
    groups = {"redis": [stack.redis.process.pid]}
    before, client = cpu_ticks(groups), time.process_time()
    for _ in range(count):
        line.exchange([("PING",)])
    client = time.process_time() - client
    return client / count * 1e6, cpu_seconds(before, cpu_ticks(groups))["redis"] / count * 1e6


def measure_bare(args, work: Path, items: int) -> dict:
    clients = args.clients_single if items == 1 else args.clients_batch
    with bare({}) as running:
        wait_for_answer(running.url, body(items).body.decode())
        result = point(running.url, {"web": [running.web.pid]}, body(items), clients, args.duration, work)
    return {**result, "code": "bare ASGI", "workers": 0, "items": items, "clients": clients,
            "items_s": result["rps"] * items}


def row(runs: list[dict]) -> str:
    def med(get) -> float:
        return statistics.median(get(r) for r in runs)

    first = runs[0]
    requests = [r["rps"] * r["seconds"] for r in runs]

    def cpu_ms(group: str) -> float:
        return statistics.median(r["cpu"].get(group, 0) / n * 1000 for r, n in zip(runs, requests))

    web, worker, redis_ms = cpu_ms("web"), cpu_ms("worker"), cpu_ms("redis")
    model = statistics.median(r.get("model_cpu", 0) / n * 1000 for r, n in zip(runs, requests))
    total = web + worker + redis_ms
    per_item = total / first["items"] * 1000
    accelerator = ("| – | – | – |" if first["workers"] == 0 else
                   f"| {med(lambda r: r['items_s'] / r['ceiling']):.2f} | {med(lambda r: r['busy']):.2f} "
                   f"| {med(lambda r: r['mean_batch']):.1f} |")
    return (f"| {first['code']} | {first['workers'] or '–'} | {first['items']} | {first['clients']} "
            f"| {med(lambda r: r['rps']):.0f} | {med(lambda r: r['items_s']):.0f} {accelerator} "
            f"{med(lambda r: r['p50_ms']):.1f} | {med(lambda r: r['p99_ms']):.1f} "
            f"| {web:.3f} | {worker:.3f} | {redis_ms:.3f} | **{total:.3f}** | {per_item:.1f} | {model:.3f} "
            f"| {med(lambda r: r['other_cores']):.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accelerator", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10, help="seconds of each wrk run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-ms", type=float, default=2.0, help="the paced model's cost per run")
    parser.add_argument("--item-ms", type=float, default=0.01, help="and per item of a run")
    parser.add_argument("--clients-single", type=int, default=128, help="wrk connections sending one item each")
    parser.add_argument("--clients-batch", type=int, default=16, help="wrk connections sending 32 items each")
    parser.add_argument("--workers", default="1,2", help="comma-separated numbers of workers")
    parser.add_argument("--items", default=f"1,{BATCH}", help="comma-separated items per request")
    parser.add_argument("--before", type=Path, help="a checkout whose worker runs beside this one's")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    counts = [int(n) for n in args.workers.split(",")]
    runs: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="funnel-accelerator-") as tmp:
        work = Path(tmp)
        model_store = store(work)
        codes: list[tuple[str, Path | None]] = [("pipelined", None)]
        if args.before:
            codes.append((f"before ({commit_of(args.before)})", link_tree(args.before, work)))
        for round_ in range(args.rounds):
            for items in [int(n) for n in args.items.split(",")]:
                result = measure_bare(args, work, items)
                runs.setdefault(("bare", 0, items), []).append(result)
                print(f"round {round_ + 1}: bare ASGI, {items} items: {result['rps']:.0f} req/s", flush=True)
                for workers in counts:
                    order = codes if round_ % 2 == 0 else codes[::-1]
                    for code, path in order:
                        result = measure(args, model_store, work, code, path, workers, items)
                        runs.setdefault((code, workers, items), []).append(result)
                        print(f"round {round_ + 1}: {code}, {workers} worker(s), {items} items: "
                              f"{result['rps']:.0f} req/s, {result['items_s']:.0f} items/s "
                              f"({result['items_s'] / result['ceiling']:.2f} of the ceiling), busy "
                              f"{result['busy']:.2f}, batch {result['mean_batch']:.1f}, CPU ms/req "
                              + ", ".join(f"{g} {s / (result['rps'] * result['seconds']) * 1000:.3f}"
                                          for g, s in result["cpu"].items()), flush=True)
    ceiling = BATCH / ((args.batch_ms + args.item_ms * BATCH) / 1000)
    trips = [r["round_trip"] for key, rs in runs.items() if key[0] != "bare" for r in rs]
    client_us, redis_us = (statistics.median(t[i] for t in trips) for i in (0, 1))
    floor = (f"A Redis round trip from Python (PING on a thread's own connection, common/link/line.py), "
             f"timed after each point: {client_us:.1f} µs of the client's CPU and {redis_us:.1f} µs of "
             f"Redis's (medians). A {BATCH}-item request, a batch of its own, makes four (its push, the "
             f"take, the reply, the inbox's pop; single items share them), whose floor is "
             f"{4 * (client_us + redis_us) / 1000:.3f} ms a request, "
             f"{4 * (client_us + redis_us) / BATCH:.1f} µs an item of a {BATCH}-item request, beside the "
             f"bare ASGI floor above.\n")
    table = ["| worker | workers | items per request | clients | req/s | items/s | of the paced ceiling | busy "
             "| mean batch | p50 ms | p99 ms | CPU ms/request: web | worker | Redis | all three | CPU µs per item "
             "| the model's CPU ms/request, not counted | wrk + other load (cores) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(runs, key=lambda k: (k[2], k[0] != "bare", k[1], k[0])):
        table.append(row(runs[key]))
    stamp = time.strftime("%Y-%m-%d %H:%M")
    report = (f"# The worker against a paced accelerator, {stamp}\n\nMachine: {machine()}\n\n"
              f"Command: `python -m benchmarks.accelerator {' '.join(argv if argv is not None else sys.argv[1:])}` "
              f"(the toy scorer in batches of {BATCH}, each run paced at {args.batch_ms:g} ms + {args.item_ms:g} ms "
              f"per item: a ceiling of {ceiling:.0f} items/s per worker; wrk -t1 -d{args.duration:g}s; "
              f"{'medians over ' + str(args.rounds) + ' rounds' if args.rounds > 1 else 'one round'}; "
              f"CPU per request from /proc over the run, the workers' less the toy graph's own (shown apart); "
              f"busy = time in run / (workers x seconds), counted by the "
              f"paced backends; the web tier at its "
              f"defaults, {os.cpu_count()} cores shared by everything, wrk included)\n\n"
              + "\n".join(table) + "\n\n" + floor)
    save("accelerator", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
