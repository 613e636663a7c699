"""The web tier's CPU per request, A/B: web settings side by side in one interleaved run.

    python -m benchmarks.web_cpu [--rounds 3] [--duration 10] [--clients 32] \
        [--clients 32,128,512] [--variant NAME=FUNNEL_X=1,FUNNEL_Y=2 ...]

Each variant is a stack (private Redis, the web tier, one text-embedding
worker) started with its own FUNNEL_* settings (both tiers get them: each takes
what it declares, so a variant can change the worker too; WORKERS=N starts N
workers for the model instead of one; ROUTE=v2 sends the same sentence to
/v2/models/text-embedding/infer instead of /v1's predict, ROUTE=openai to
/v1/embeddings (base64, as OpenAI's client asks), ROUTE=grpc to the gRPC
service's ModelInfer in raw_input_contents (funnel-grpc, loaded by
benchmarks/grpc_load.py instead of wrk; its CPU is then the "web" column);
ITEMS=N sends N copies of the sentence in each request; PYTHONPATH=<a
checkout's link tree> runs another version of Funnel), or, named `bare...`,
the floor: an ASGI app that parses the JSON and answers a constant under the
same gunicorn settings (benchmarks/peers/bare_asgi.py); every round starts each
variant in turn (the order rotating), warms it, runs wrk with one sentence
per POST at each number of clients, and reads the CPU seconds of the web processes (gunicorn master and
workers, or funnel-grpc), the worker and Redis from /proc over the run. Throughput and CPU are per item
(a sentence: one per request but with ITEMS). Prints medians over rounds and saves the table under
benchmarks/results/ with the machine.

    python -m benchmarks.web_cpu --variant v1= --variant v2=ROUTE=v2 --variant openai=ROUTE=openai \
        --variant grpc=ROUTE=grpc     # the four doors to the same model, in one run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

from benchmarks import ROOT, save
from benchmarks.core import BODY, SENTENCE, V2_BODY, in_process_ceiling, machine, wrk
from benchmarks.cpu import cpu_seconds, cpu_ticks, machine_busy_s
from benchmarks.systems import gunicorn
from funnel.common import settings as loader
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from funnel.web.settings import WebSettings
from tests.conftest import http

MODEL = "text-embedding"
DEFAULT_VARIANTS = ["defaults="]
# Each HTTP route's path, and its body for n copies of the same sentence, in each protocol's request.
ROUTES = {
    "v1": (f"/v1/models/{MODEL}/predict", lambda n: BODY if n == 1 else json.dumps({"texts": [SENTENCE] * n})),
    "v2": (f"/v2/models/{MODEL}/infer", lambda n: V2_BODY if n == 1 else json.dumps(
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [n], "data": [SENTENCE] * n}]})),
    "openai": ("/v1/embeddings", lambda n: json.dumps({"model": MODEL, "input": SENTENCE if n == 1 else [SENTENCE] * n,
                                                       "encoding_format": "base64"})),
}
BENCH_ONLY = ("ROUTE", "WORKERS", "ITEMS")  # the variant's own options, not settings


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, settings = text.partition("=")
    env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
    return name, env


@contextlib.contextmanager
def bare(env: dict[str, str]):
    """The bare app under the gunicorn settings Funnel's web tier would take from env."""
    settings = loader.load(WebSettings, [], environ=env)
    port = free_port()
    command = gunicorn("benchmarks.peers.bare_asgi:app", port, settings.process_count(),
                       ["-k", "funnel.web.transport.protocol.Worker"])
    web = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", web=web, workers=[], redis=None)
    finally:
        web.terminate()
        web.wait(10)


def wait_for_answer(url: str, body: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, _, _ = http("POST", url, body=body.encode(), headers={"Content-Type": "application/json"},
                                timeout=5)
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer within {timeout_s:g} s")
        time.sleep(0.2)


def start(name: str, env: dict[str, str]):
    if name.startswith("bare"):
        return bare(env)
    # Each process takes the settings it declares and ignores the rest: one variant can set both tiers.
    settings = {k: v for k, v in env.items() if k not in BENCH_ONLY}
    return Stack(models=[MODEL], web_env=settings, worker_env=settings, workers=[MODEL] * int(env.get("WORKERS", 1)),
                 log_dir=ROOT / "benchmarks" / "results" / "tmp",
                 grpc_port=free_port() if env.get("ROUTE") == "grpc" else None)


def grpc_load(port: int, clients: int, duration_s: int, items: int) -> dict:
    """benchmarks/grpc_load.py in a process of its own, as wrk is: its rps, errors, p50 and p99."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.grpc_load", f"127.0.0.1:{port}", "--concurrency",
                          str(clients), "--duration", str(duration_s), "--items", str(items)], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=duration_s + 60).stdout
    return json.loads(out.splitlines()[-1])


def measure(name: str, env: dict[str, str], clients: list[int], duration_s: int) -> list[dict]:
    runs = []
    route, items = env.get("ROUTE", "v1"), int(env.get("ITEMS", 1))
    with start(name, env) as stack:
        if route == "grpc":
            def drive(c: int, seconds: int) -> dict:
                return grpc_load(stack.grpc_port, c, seconds, items)
            front = stack.grpc
        else:
            path, body_of = ROUTES[route]
            body = body_of(items)
            wait_for_answer(stack.url + path, body)

            def drive(c: int, seconds: int) -> dict:
                return wrk(stack.url + path, c, seconds, body)
            front = stack.web
        drive(clients[0], 3)  # warm-up
        groups = {"worker": [p.pid for p in stack.workers], "web": [front.pid],
                  "redis": [stack.redis.process.pid] if stack.redis else []}
        for c in clients:
            before, busy = cpu_ticks(groups), machine_busy_s()
            result = drive(c, duration_s)
            spent = cpu_seconds(before, cpu_ticks(groups))
            busy = machine_busy_s() - busy
            result["rps"] *= items  # items, not calls
            requests = result["rps"] * duration_s
            assert result["errors"] == 0, result
            runs.append({"variant": name, "clients": c, "rps": result["rps"], "p50": result["p50"],
                         "p99": result["p99"], **{f"{group}_ms": spent[group] / requests * 1000 for group in groups},
                         "other_cores": max(0.0, busy - sum(spent.values())) / duration_s})
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.web_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds of each wrk run")
    parser.add_argument("--clients", default="32", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=FUNNEL_SETTING=value,... (the stack's environment, web tier and worker; "
                             "WORKERS=N: N workers); repeatable")
    args = parser.parse_args(argv)
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    clients = [int(c) for c in args.clients.split(",")]
    runs: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.rounds):
        shift = round_ % len(variants)
        for name, env in variants[shift:] + variants[:shift]:
            for run in measure(name, env, clients if round_ % 2 == 0 else clients[::-1], args.duration):
                runs.setdefault((name, run["clients"]), []).append(run)
                print(f"round {round_ + 1}: {name}, {run['clients']} clients: {run['rps']:.0f} req/s, "
                      f"web {run['web_ms']:.3f} ms/req, worker {run['worker_ms']:.2f}, "
                      f"other {run['other_cores']:.2f} cores", flush=True)
    ceiling = in_process_ceiling(32)
    table = ["| variant | web settings | clients | items/s [min–max] | vs ceiling | p50 ms | p99 ms | CPU ms/item "
             "web [min–max] | worker | redis | load + other (cores) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in clients:
        for name, env in variants:
            got = runs[name, c]

            def med(key, got=got):
                return statistics.median(r[key] for r in got)

            rps, web = [r["rps"] for r in got], [r["web_ms"] for r in got]
            settings = ", ".join(f"{k}={v}" for k, v in env.items()) or "defaults"
            table.append(f"| {name} | {settings} | {c} | {med('rps'):.0f} [{min(rps):.0f}–{max(rps):.0f}] | "
                         f"{med('rps') / ceiling:.2f} | {med('p50'):.1f} | {med('p99'):.1f} | "
                         f"{med('web_ms'):.3f} [{min(web):.3f}–{max(web):.3f}] | {med('worker_ms'):.2f} | "
                         f"{med('redis_ms'):.3f} | {med('other_cores'):.2f} |")
    stamp = dt.datetime.now()
    report = (f"# Web tier CPU per request, {stamp:%Y-%m-%d %H:%M}\n\nMachine: {machine()}\n\n"
              f"Command: `python -m benchmarks.web_cpu {' '.join(argv or sys.argv[1:])}` ({MODEL}, wrk -t1 "
              f"-d{args.duration}s, one sentence per POST, or benchmarks/grpc_load.py for ROUTE=grpc; "
              f"medians over {args.rounds} interleaved rounds, "
              f"the variants' order rotating and the clients' sweep reversed every other round; in-process "
              f"ONNX ceiling at batch 32: {ceiling:.0f} items/s)\n\n"
              + "\n".join(table) + "\n")
    save("web-cpu", report)
    shutil.rmtree(ROOT / "benchmarks" / "results" / "tmp", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
