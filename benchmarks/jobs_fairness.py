"""Interactive latency with and without a large bulk job running on the same model.

    python -m benchmarks.jobs_fairness [--items 100000] [--requests 600] [--clients 4]

Starts the stack as `funnel up` does (one text-embedding worker, its default
batch of 32, no front door), warms it up, then sends the same interactive load
twice from `clients` threads (one single-text predict at a time each): alone,
and while a bulk job of `items` texts runs on the same worker. Reports p50,
p90, p99 and the interactive rate of each run, how long the submit took, and
how many bulk items per second went through alone and beside the interactive
load, and how many cores the rest of the machine kept busy meanwhile (above
about 0.1, the run was disturbed). The job is cancelled at the end (a 100,000-text job takes about six
minutes to finish here). The table goes to
benchmarks/results/jobs-fairness-<date>.md with the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks import save
from benchmarks.cpu import cpu_seconds, cpu_ticks, machine_busy_s
from benchmarks.machine import cpu_model, loadavg
from funnel.scripts.stack import Stack
from funnel_client import Client

MODEL = "text-embedding"
SENTENCE = "A man is eating food on a sunny afternoon in the park."
BULK_ALONE_S = 10.0  # how long the bulk rate is measured with no interactive load


def corpus(n: int) -> list[str]:
    """Texts of 5 to 40 words, as a real corpus varies."""
    return [f"passage {i}: {'the quick brown fox jumps over the lazy dog ' * (i % 4 + 1)}" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def interactive(stack: Stack, requests: int, clients: int) -> dict:
    """`requests` single-text predicts from `clients` threads: latency percentiles (ms), rate, and the
    cores the rest of the machine used meanwhile."""
    url = stack.url
    ours = {"ours": [os.getpid(), stack.web.pid, stack.redis.process.pid, *(w.pid for w in stack.workers)]}
    ticks, busy = cpu_ticks(ours), machine_busy_s()
    local = threading.local()
    times: list[float] = []

    def one(_):
        if not hasattr(local, "client"):
            local.client = Client(url, retries=10)
        started = time.perf_counter()
        local.client.predict(MODEL, text=SENTENCE)
        times.append((time.perf_counter() - started) * 1000)

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    seconds = time.monotonic() - started
    other = (machine_busy_s() - busy - cpu_seconds(ticks, cpu_ticks(ours))["ours"]) / seconds
    return {"p50": percentile(times, 0.5), "p90": percentile(times, 0.9), "p99": percentile(times, 0.99),
            "mean": statistics.fmean(times), "rate": requests / seconds, "seconds": seconds,
            "other_cores": max(0.0, other)}


def done_items(client: Client, job_id: str) -> int:
    return client.job_status(job_id)["progress"]["done"]


def measure(stack: Stack, items: int, requests: int, clients: int) -> dict:
    interactive(stack, min(100, requests), clients)  # warm up: the worker's cost fit, connections
    alone = interactive(stack, requests, clients)
    print(f"alone: p50 {alone['p50']:.0f} ms, p99 {alone['p99']:.0f} ms", flush=True)
    with Client(stack.url, timeout=300) as client:
        texts = corpus(items)
        started = time.monotonic()
        job = client.submit_job(MODEL, texts)
        submit_s = time.monotonic() - started
        del texts
        print(f"submitted {items} texts in {submit_s:.1f} s", flush=True)
        begin, t0 = done_items(client, job["id"]), time.monotonic()
        time.sleep(BULK_ALONE_S)  # the bulk rate alone, over a fixed span
        before, t1 = done_items(client, job["id"]), time.monotonic()
        bulk_alone = (before - begin) / (t1 - t0)
        beside = interactive(stack, requests, clients)
        after, t2 = done_items(client, job["id"]), time.monotonic()
        final = client.cancel(job["id"])
    print(f"with the job: p50 {beside['p50']:.0f} ms, p99 {beside['p99']:.0f} ms", flush=True)
    return {"alone": alone, "beside": beside, "submit_s": submit_s, "bulk_alone": bulk_alone,
            "bulk_beside": (after - before) / (t2 - t1), "bulk_done": final["progress"]["done"],
            "still_running": final["state"] == "cancelled"}


def table(r: dict, items: int, clients: int) -> str:
    lines = [f"| interactive load ({clients} clients) | p50 ms | p90 ms | p99 ms | mean ms | requests/s "
             "| bulk items/s meanwhile | other load (cores) |", "|---|---|---|---|---|---|---|---|"]
    rows = [("no bulk job", r["alone"], "–"),
            (f"a {items:,}-text job running", r["beside"], f"{r['bulk_beside']:.0f}")]
    for name, m, bulk in rows:
        lines.append(f"| {name} | {m['p50']:.0f} | {m['p90']:.0f} | {m['p99']:.0f} | {m['mean']:.0f} "
                     f"| {m['rate']:.1f} | {bulk} | {m['other_cores']:.2f} |")
    lines += ["", f"- submit of {items:,} texts (preprocessing, one MULTI/EXEC): {r['submit_s']:.1f} s",
              f"- bulk items/s with no interactive load: {r['bulk_alone']:.0f}",
              f"- items done when the job was cancelled: {r['bulk_done']:,} of {items:,}"
              + ("" if r["still_running"] else " (it had finished: give it more items)")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jobs_fairness",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000, help="texts in the bulk job")
    parser.add_argument("--requests", type=int, default=600, help="interactive requests per run")
    parser.add_argument("--clients", type=int, default=4, help="interactive client threads")
    parser.add_argument("--store", default="model_store")
    args = parser.parse_args(argv)
    load_before = loadavg()
    with Stack(model_store=args.store, models=[MODEL]) as stack:
        result = measure(stack, args.items, args.requests, args.clients)
    report = (f"# Interactive latency beside a bulk job, {dt.datetime.now():%Y-%m-%d %H:%M}\n\n"
              f"Machine: {cpu_model()}, {os.cpu_count()} cores (load average before: {load_before}); "
              f"one {MODEL} worker, ONNX on the CPU, batch 32, default settings (FUNNEL_BULK_SHARE 0.25); "
              f"`python -m benchmarks.jobs_fairness --items {args.items} --requests {args.requests} "
              f"--clients {args.clients}`\n\n{table(result, args.items, args.clients)}\n")
    save("jobs-fairness", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
