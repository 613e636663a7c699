"""Priority lanes at twice the capacity: what each lane waits, and who is turned away.

    python -m benchmarks.priorities [--load 2.0] [--seconds 20] [--mix 0.1,0.3,0.6] [--timeout-s 1]

One worker of the toy scorer paced like an accelerator (PacedScore: batches of
up to 4, 10 ms + 5 ms an item, about 130 items/s, whatever the CPU does). Two
rounds of open-loop arrivals (exponential gaps: requests do not wait for each
other's answers), each request in a lane drawn from `mix` (high, normal, low)
with `X-Priority` and `X-Request-Timeout: timeout_s`:

- light: 0.3 x the capacity, each lane's own p50 and p99;
- loaded: `load` x the capacity (the capacity measured, not assumed: the
  worker's served rate when flooded, first).

Per lane and round: requests sent, answered, turned away (503) and late
(504), p50 and p99 of the answered, and the lane's share of what was served.
The targets (issue 33): high's loaded p99 at most 2x its light-load p99, low
turned away first, every lane served. Written to
benchmarks/results/priorities-<date>.md with the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks import save
from benchmarks.core import machine
from benchmarks.hangups import BODY, MODEL, paced_stack
from funnel.common.contracts.priority import LANES
from tests.support import http

LIGHT = 0.3


def one(url: str, lane: str, timeout_s: float) -> tuple[str, int, float]:
    started = time.monotonic()
    status, _, _ = http("POST", f"{url}/v1/models/{MODEL}/predict", BODY, timeout=60,
                        headers={"Content-Type": "application/json", "X-Priority": lane,
                                 "X-Request-Timeout": f"{timeout_s:g}"})
    return lane, status, time.monotonic() - started


def capacity(url: str, seconds: float = 5.0, clients: int = 32) -> float:
    """Answers per second with the worker flooded by closed-loop clients (normal lane, no deadline)."""
    answered: list[float] = []
    ends = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < ends:
            if one(url, "normal", 60)[1] == 200:
                answered.append(time.monotonic())

    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(client)
    settled = [t for t in answered if t > ends - seconds + 1]  # the first second fills the queue
    return len(settled) / (seconds - 1)


def round_(url: str, rate: float, seconds: float, mix: list[float], timeout_s: float, seed: int) -> list[tuple]:
    """Open-loop arrivals at `rate` requests/s for `seconds`: (lane, status, seconds) of each."""
    rng = random.Random(seed)
    results: list[tuple] = []
    lock = threading.Lock()

    def run(lane: str) -> None:
        outcome = one(url, lane, timeout_s)
        with lock:
            results.append(outcome)

    with ThreadPoolExecutor(256) as pool:
        started = time.monotonic()
        due = started
        while due - started < seconds:
            due += rng.expovariate(rate)
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            pool.submit(run, rng.choices(LANES, weights=mix)[0])
    return results


def summary(results: list[tuple]) -> dict[str, dict]:
    served = sum(status == 200 for _, status, _ in results) or 1
    out = {}
    for lane in LANES:
        mine = [(status, s) for name, status, s in results if name == lane]
        ok = sorted(s for status, s in mine if status == 200)
        out[lane] = {"sent": len(mine), "answered": len(ok), "shed": sum(st == 503 for st, _ in mine),
                     "late": sum(st == 504 for st, _ in mine),
                     "other": sum(st not in (200, 503, 504) for st, _ in mine),
                     "p50": statistics.median(ok) if ok else float("nan"),
                     "p99": statistics.quantiles(ok, n=100)[-1] if len(ok) >= 2 else float("nan"),
                     "share": len(ok) / served}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=2.0, help="the loaded round's rate, x the capacity")
    parser.add_argument("--seconds", type=float, default=20.0, help="each round's length")
    parser.add_argument("--mix", default="0.1,0.3,0.6", help="shares of high, normal, low requests")
    parser.add_argument("--timeout-s", type=float, default=1.0, help="each request's X-Request-Timeout")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    mix = [float(x) for x in args.mix.split(",")]
    with paced_stack() as stack:
        one(stack.url, "normal", 60)
        ceiling = capacity(stack.url)
        time.sleep(2)  # the flood's queue drains
        light = summary(round_(stack.url, LIGHT * ceiling, args.seconds, mix, args.timeout_s, args.seed))
        loaded = summary(round_(stack.url, args.load * ceiling, args.seconds, mix, args.timeout_s, args.seed + 1))
    stamp = dt.datetime.now()
    command = (f"python -m benchmarks.priorities --load {args.load:g} --seconds {args.seconds:g} --mix {args.mix} "
               f"--timeout-s {args.timeout_s:g}")
    lines = [f"# Priority lanes at {args.load:g}x the capacity, {stamp:%Y-%m-%d %H:%M}", "",
             f"Machine: {machine()}", "",
             f"Command: `{command}` (one worker, the toy scorer paced at 10 ms + 5 ms an item in batches of up "
             f"to 4; open-loop arrivals; the load generator shares the machine). Capacity measured first: "
             f"{ceiling:.0f} answers/s.", "",
             "| round | lane | sent | answered | shed (503) | late (504) | other | p50 ms | p99 ms "
             "| share of answers |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows, rate in (("light", light, LIGHT), ("loaded", loaded, args.load)):
        for lane in LANES:
            r = rows[lane]
            lines.append(f"| {name} ({rate:g}x) | {lane} | {r['sent']} | {r['answered']} | {r['shed']} | {r['late']} "
                         f"| {r['other']} | {r['p50'] * 1000:.0f} | {r['p99'] * 1000:.0f} | {r['share']:.2f} |")
    ratio = loaded["high"]["p99"] / light["high"]["p99"]
    shed = {lane: loaded[lane]["shed"] / max(1, loaded[lane]["sent"]) for lane in LANES}
    lines += ["", f"High p99 loaded / light: **{ratio:.2f}** (target at most 2). "
              f"Turned away when loaded: high {shed['high']:.1%}, normal {shed['normal']:.1%}, "
              f"low {shed['low']:.1%}. Every lane served: "
              f"{'yes' if all(loaded[lane]['answered'] for lane in LANES) else 'no'}."]
    save("priorities", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
