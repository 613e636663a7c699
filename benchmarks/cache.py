"""The result cache on the text model: throughput and latency at hit ratios against the cache off.

    python -m benchmarks.cache [--rounds 2] [--duration 8] [--clients 32]

Two stacks (each a private Redis, the web tier and one text-embedding worker): one serving the
shipped model as it is (the cache off), one serving the same files with model.json's
`"cache": {"ttl_s": 3600}`. Every round runs, in a rotating order, wrk against the cache off and
against the cache on at 0, 50, 90, 99 and 100% hits: each request one sentence, drawn from a
pool of sentences warmed before the run with the hit ratio's probability, else a sentence no
request sent before. For each run: items/s, p50 and p99, and the CPU milliseconds per item of
the web tier, Redis and the worker (from /proc), and the items the worker computed per item
sent (its counters as its heartbeat last wrote them). Then, one client
at a time, the latency of a hit. Prints medians over rounds and saves the table under
benchmarks/results/ with the machine. A shared machine makes the figures noisy: read them as
ratios within one run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import ROOT, save
from benchmarks.core import machine
from benchmarks.cpu import cpu_seconds, cpu_ticks, machine_busy_s
from benchmarks.measure import funnel_counters
from funnel.scripts.stack import Stack
from tests.support import http

MODEL = "text-embedding"
PATH = f"/v1/models/{MODEL}/predict"
POOL = 200  # sentences warmed before the run: the hits
RATIOS = (0.0, 0.5, 0.9, 0.99, 1.0)

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local ratio, pool, nonce = {ratio}, {pool}, "{nonce}"
local counter = 0
math.randomseed(os.time() + {seed})
request = function()
  counter = counter + 1
  local text
  if math.random() < ratio then
    text = "a sentence the cache has seen, number " .. math.random(1, pool)
  else
    text = "a sentence nobody sent before, " .. nonce .. " " .. counter .. " " .. math.random(1, 1000000000)
  end
  return wrk.format(nil, nil, nil, '{{"text": "' .. text .. '"}}')
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %f %f\\n", summary.requests, summary.errors.status,
    summary.duration, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


def cached_store(folder: Path) -> Path:
    """The shipped text model, its files linked, its model.json caching for an hour."""
    shipped = ROOT / "model_store" / MODEL
    target = folder / "store" / MODEL
    target.mkdir(parents=True)
    for path in shipped.resolve().iterdir():
        if path.name != "model.json":
            (target / path.name).symlink_to(path)
    meta = json.loads((shipped / "model.json").read_text())
    (target / "model.json").write_text(json.dumps({**meta, "cache": {"ttl_s": 3600}}))
    return folder / "store"


def drive(url: str, ratio: float, clients: int, duration_s: int, seed: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT.format(ratio=ratio, pool=POOL, nonce=os.urandom(6).hex(), seed=seed))
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{duration_s}s", "--timeout", "30s", "-s",
                              script.name, url + PATH], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(script.name)
    requests, errors, duration_us, p50, p99 = re.search(r"RESULT (\S+) (\S+) (\S+) (\S+) (\S+)", out).groups()
    return {"rps": int(requests) / (int(duration_us) / 1e6), "requests": int(requests), "errors": int(errors),
            "p50": float(p50), "p99": float(p99)}


def run(stack: Stack, ratio: float, clients: int, duration_s: int, seed: int) -> dict:
    groups = {"worker": [p.pid for p in stack.workers], "web": [stack.web.pid],
              "redis": [stack.redis.process.pid] if stack.redis else []}
    computed = funnel_counters(stack, MODEL).get("items", 0.0)
    before, busy = cpu_ticks(groups), machine_busy_s()
    result = drive(stack.url, ratio, clients, duration_s, seed)
    spent = cpu_seconds(before, cpu_ticks(groups))
    busy = machine_busy_s() - busy
    assert result["errors"] == 0, result
    n = result["requests"]
    return {**result, **{f"{group}_ms": spent[group] / n * 1000 for group in groups},
            "computed": (funnel_counters(stack, MODEL).get("items", 0.0) - computed) / n,
            "other_cores": max(0.0, busy - sum(spent.values())) / duration_s}


def warm(stack: Stack) -> None:
    for i in range(1, POOL + 1):
        text = f"a sentence the cache has seen, number {i}"
        status, body, _ = http("POST", stack.url + PATH, json_body={"text": text})
        assert status == 200, body


def table(runs: dict[str, list[dict]]) -> list[str]:
    off = runs["off"]
    rows = ["| variant | items/s [min–max] | vs off, per round | p50 ms | p99 ms | web ms/item | redis ms/item | "
            "web + redis vs off | worker ms/item | computed / item | other cores |", "|" + "---|" * 11]
    for name, got in runs.items():
        def med(key, got=got):
            return statistics.median(r[key] for r in got)
        speed = [r["rps"] / o["rps"] for r, o in zip(got, off)]
        front = [(r["web_ms"] + r["redis_ms"]) / (o["web_ms"] + o["redis_ms"]) for r, o in zip(got, off)]
        rps = [r["rps"] for r in got]
        rows.append(f"| {name} | {med('rps'):.0f} [{min(rps):.0f}–{max(rps):.0f}] | {statistics.median(speed):.2f} "
                    f"[{min(speed):.2f}–{max(speed):.2f}] | {med('p50'):.1f} | {med('p99'):.1f} | "
                    f"{med('web_ms'):.3f} | {med('redis_ms'):.3f} | {statistics.median(front):.2f} | "
                    f"{med('worker_ms'):.2f} | {med('computed'):.2f} | {med('other_cores'):.2f} |")
    return rows


def hit_against_miss(runs: dict[str, list[dict]]) -> str:
    """A hit's web + Redis CPU against a miss's (100% hits against 0%), paired by round."""
    ratios = [(hit["web_ms"] + hit["redis_ms"]) / (miss["web_ms"] + miss["redis_ms"])
              for hit, miss in zip(runs["on, 100% hits"], runs["on, 0% hits"])]
    return (f"A hit's web + Redis CPU against a miss's, paired by round: {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}–{max(ratios):.2f}].")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=int, default=8, help="seconds of each wrk run")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    variants = [("off", None), *((f"on, {ratio:.0%} hits", ratio) for ratio in RATIOS)]
    runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
    logs = ROOT / "benchmarks" / "results" / "tmp"
    with tempfile.TemporaryDirectory(prefix="cache-") as folder, \
            Stack(models=[MODEL], log_dir=logs) as off, \
            Stack(model_store=cached_store(Path(folder)), models=[MODEL], log_dir=logs) as on:
        warm(on)
        drive(off.url, 0.0, args.clients, 3, 0)  # warm-up: both stacks' first batches, JIT-free but cold caches
        drive(on.url, 0.0, args.clients, 3, 0)
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for name, ratio in order:
                runs[name].append(run(off, 0.0, args.clients, args.duration, r) if ratio is None
                                  else run(on, ratio, args.clients, args.duration, r))
                print(name, {k: round(v, 3) for k, v in runs[name][-1].items()}, file=sys.stderr)
        single = drive(on.url, 1.0, 1, args.duration, 99)
    shutil.rmtree(logs, ignore_errors=True)
    stamp = dt.datetime.now()
    report = (f"# The result cache on {MODEL}, {stamp:%Y-%m-%d %H:%M}\n\nMachine: {machine()} (the rest of the "
              f"machine's load in the last column; the \"vs off\" columns pair each round's runs)\n\n"
              f"Command: `python -m benchmarks.cache {' '.join(argv or sys.argv[1:])}` (wrk -t1 -c{args.clients} "
              f"-d{args.duration}s, one sentence per POST; medians over {args.rounds} interleaved rounds, the "
              f"order rotating; CPU ms per item from /proc)\n\n" + "\n".join(table(runs)) + "\n\n"
              f"{hit_against_miss(runs)}\n\n"
              f"A hit, one client at a time ({single['requests']} requests): p50 {single['p50']:.2f} ms, "
              f"p99 {single['p99']:.2f} ms.\n")
    save("cache", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
