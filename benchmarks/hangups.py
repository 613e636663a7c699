"""Clients that hang up: how much model time their requests still cost, and what the others wait.

    python -m benchmarks.hangups [--requests 1000] [--clients 200] [--leave-ms 50]

One worker of the toy scorer paced like an accelerator (PacedScore: batches of
up to 4, 10 ms + 5 ms an item, about 130 items/s, whatever the CPU does), and
two rounds of `requests` predicts sent by `clients` threads at once:

- stay: each client waits for its answer (what the workers must compute);
- leave: each client hangs up `leave_ms` after sending its request (a request
  whose client left before the web tier queued it is never queued).

Meanwhile a probe sends one ordinary request after another and times them. Per
round: the jobs the worker ran (its registry totals) and dropped unrun because
their client had left, and the probe's latencies. Written to
benchmarks/results/hangups-<date>.md with the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

from benchmarks import save
from benchmarks.core import machine
from funnel.common.contracts import registry
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import http

MODEL = "toy-paced"
BODY = json.dumps({"input": [0.5, -1, 2, 0]}).encode()


def totals(client: redis.Redis) -> dict[str, float]:
    workers = [w for w in registry.live_workers(client, Keys()) if w.get("model") == MODEL]
    return {name: sum(registry.counter(w, name) for w in workers) for name in ("items", "left")}


def settled(client: redis.Redis, quiet_s: float = 3.0) -> dict[str, float]:
    """The worker's totals once they stop changing (they reach the registry with its heartbeats)."""
    last, since = totals(client), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.25)
        now = totals(client)
        if now != last:
            last, since = now, time.monotonic()
    return last


@contextlib.contextmanager
def paced_stack(**web_env: str) -> Iterator[Stack]:
    """A stack of one worker of the toy scorer paced at 10 ms + 5 ms an item in batches of up to 4."""
    with tempfile.TemporaryDirectory(prefix="funnel-paced-") as tmp:
        store, work = Path(tmp) / "store", Path(tmp) / "work"
        store.mkdir()
        work.mkdir()
        toy_model.add_paced(store, work, MODEL, 0.01, 0.005, batch_size=4)
        env = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}
        with Stack(model_store=store, models=[MODEL], worker_env=env,
                   web_env={**env, "FUNNEL_REQUEST_TIMEOUT_S": "60", **web_env}) as stack:
            yield stack


def send(port: int, leave_s: float | None) -> None:
    """One predict; hang up leave_s after sending it, or read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
        conn.sendall(b"POST /v1/models/%s/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (MODEL.encode(), len(BODY), BODY))
        if leave_s is not None:
            time.sleep(leave_s)
            return
        while conn.recv(65536):
            pass


def round_(stack: Stack, requests: int, clients: int, leave_s: float | None) -> dict:
    client = redis.Redis.from_url(stack.redis_url)
    port = int(stack.url.rsplit(":", 1)[1])
    before = settled(client)
    probes: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            started = time.monotonic()
            status, _, _ = http("POST", f"{stack.url}/v1/models/{MODEL}/predict", BODY, timeout=120,
                                headers={"Content-Type": "application/json"})
            if status == 200:
                probes.append(time.monotonic() - started)

    prober = threading.Thread(target=probe, daemon=True)
    started = time.monotonic()
    prober.start()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: send(port, leave_s), range(requests)))
    # Until every job is run or dropped: the queue empty and the totals still.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and client.llen(Keys().queue(MODEL)) > 0:
        time.sleep(0.05)
    done.set()
    prober.join(timeout=120)
    seconds = time.monotonic() - started
    after = settled(client)
    ran = after["items"] - before["items"] - len(probes)
    return {"round": "leave" if leave_s is not None else "stay", "requests": requests, "ran": int(ran),
            "dropped": int(after["left"] - before["left"]), "seconds": seconds, "probes": len(probes),
            "p50": statistics.median(probes) if probes else float("nan"),
            "p90": statistics.quantiles(probes, n=10)[-1] if len(probes) >= 2 else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--leave-ms", type=float, default=50)
    args = parser.parse_args(argv)
    with paced_stack(FUNNEL_SHED="0") as stack:
        http("POST", f"{stack.url}/v1/models/{MODEL}/predict", BODY, headers={"Content-Type": "application/json"})
        rows = [round_(stack, args.requests, args.clients, None),
                round_(stack, args.requests, args.clients, args.leave_ms / 1000)]
    stamp = dt.datetime.now()
    lines = [f"# Clients that hang up, {stamp:%Y-%m-%d %H:%M}", "",
             f"Machine: {machine()}", "",
             f"Command: `python -m benchmarks.hangups --requests {args.requests} --clients {args.clients} "
             f"--leave-ms {args.leave_ms:g}` (one worker, the toy scorer paced at 10 ms + 5 ms an item in batches "
             "of up to 4; a probe sends ordinary requests one after another throughout)", "",
             "| round | requests | run by the worker | dropped unrun | share run | seconds | probe answers "
             "| probe p50 ms | probe p90 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['round']} | {r['requests']} | {r['ran']} | {r['dropped']} | {r['ran'] / r['requests']:.3f} "
                     f"| {r['seconds']:.1f} | {r['probes']} | {r['p50'] * 1000:.0f} | {r['p90'] * 1000:.0f} |")
    save("hangups", "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
