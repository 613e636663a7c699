"""Many models on one worker against a worker per model: `python -m benchmarks.multiplex`.

    python -m benchmarks.multiplex [--models 20] [--resident 3] [--duration 15] [--clients 16]
                                   [--device cpu | cuda:0] [--backend onnx | torch] [--cold 40]
                                   [--base toy | MODEL] [--store model_store]

The models are copies of the toy scorer (tests/third_party/toyscore: 4 numbers
in, 3 scores out; an ONNX graph, or with --backend torch a TorchScript module),
or with --base MODEL (--backend torch) of a text model of --store, such as
text-embedding (fp32 or fp16), each with weights of its own (benchmarks/copies.py),
so every answer is checked against its own model's: a request answered by
another model counts as wrong. On a GPU whose onnxruntime has no CUDA provider,
--backend torch runs the workers on it with torch alone.
Deployments, each a private Redis, the web tier and its workers:

- multi: one worker serving every model (`--model` for each), at most
  --resident loaded at once (worker/residency.py);
- dedicated: one worker per model, each holding its model (what the same
  traffic costs without multiplexing: --models times the loaded models).

Traffic, from --clients closed-loop clients in this process, each sending one
probe (a vector, or a text) a request to a model drawn at random: `resident` over --resident
models only (the dedicated deployment then runs --resident workers: the same
memory as the multi worker's), `uniform` over all of them, `zipf` with
P(rank k) ∝ 1/k^1.1. Each point gives requests/s, p50/p99 latency, requests
answered wrong or not 200, and the multi worker's loads per minute (its
/metrics' funnel_worker_loads_total over the run). Cold start: with the multi
worker idle, one request at a time to the model loaded longest ago (never
resident then), --cold times: p50/p99 of the answer's time, the load
included, for at most --duration seconds. The points alternate the deployments
for each traffic (multi, dedicated), so that drift of a shared machine falls on both. Last, Zipf
traffic on two multi workers, one killed (kill -9) halfway through at a moment
it holds a load claim still loading: requests not answered 200, or answered
wrong, are counted. The table, with the machine, goes to
benchmarks/results/multiplex-<machine>-<date>.md. With the defaults it ends
within about four minutes; `--base text-embedding` adds the copies' making
(about a second each on a GPU machine, three on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http import client as http_client
from pathlib import Path

import redis

from benchmarks import copies, save
from benchmarks.core import machine
from funnel.common.contracts.keys import Keys
from funnel.scripts.stack import Stack
from funnel.worker.residency import CLAIM_KEPT_S
from tests import toy_model
from tests.support import http, metric

THIRD_PARTY = str(toy_model.PACKAGE_DIR)
ZIPF_S = 1.1
BATCH = 32


def make_store(work: Path, args) -> tuple[Path, copies.Probes]:
    """--models copies of --base, each with weights of its own, and what each answers the probes."""
    store = work / "store"
    store.mkdir()
    if args.base == copies.TOY:
        return store, copies.toy_copies(store, work, args.models, args.backend, BATCH)
    return store, copies.model_copies(Path(args.store), args.base, store, args.models, args.device)


def weights_of(traffic: str, count: int, resident: int) -> list[float]:
    if traffic == "resident":
        return [1.0] * resident + [0.0] * (count - resident)
    if traffic == "uniform":
        return [1.0] * count
    return [1 / (k + 1) ** ZIPF_S for k in range(count)]


class Load:
    """Closed-loop clients, each on its own keep-alive connection, for a fixed time."""

    def __init__(self, port: int, models: list[str], weights: list[float], probes: copies.Probes, seed: int):
        self.port, self.models, self.weights, self.probes = port, models, weights, probes
        self.seed = seed
        self.latencies: list[float] = []
        self.failed = self.wrong = 0
        self._lock = threading.Lock()

    def run(self, clients: int, duration_s: float) -> float:
        """Requests answered per second."""
        end = time.monotonic() + duration_s
        threads = [threading.Thread(target=self._client, args=(random.Random(self.seed + i), end))
                   for i in range(clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return len(self.latencies) / (time.monotonic() - started)

    def _client(self, rng: random.Random, end: float) -> None:
        conn = http_client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while time.monotonic() < end:
            copy = rng.choices(range(len(self.models)), self.weights)[0]
            model = self.models[copy]
            i = rng.randrange(len(self.probes.bodies))
            body = json.dumps(self.probes.bodies[i])
            started = time.perf_counter()
            try:
                conn.request("POST", f"/v1/models/{model}/predict", body, {"Content-Type": "application/json",
                                                                           "X-Request-Timeout": "30"})
                response = conn.getresponse()
                answer = json.loads(response.read())
                status = response.status
            except (OSError, http_client.HTTPException, ValueError):
                conn.close()
                conn = http_client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                status, answer = 0, {}
            seconds = time.perf_counter() - started
            with self._lock:
                if status != 200:
                    self.failed += 1
                    continue
                self.latencies.append(seconds)
                if not self.probes.right(copy, i, answer):
                    self.wrong += 1
        conn.close()


def percentiles_ms(seconds: list[float]) -> tuple[float, float]:
    if not seconds:
        return float("nan"), float("nan")
    ordered = sorted(seconds)
    return statistics.median(ordered) * 1000, ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000


def loads_total(stack: Stack) -> float:
    scraped = http("GET", f"{stack.url}/metrics")[1]["_text"]
    return metric(scraped, "funnel_worker_loads_total")


@contextlib.contextmanager
def stack_for(deployment: str, store: Path, models: list[str], served: list[str], args,
              log_dir: Path, heartbeat_ttl_s: str = "10") -> Iterator[Stack]:
    # the toy package beside what the caller already put on the path (a GPU host's carried wheels)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [THIRD_PARTY, os.environ.get("PYTHONPATH")]))}
    worker_env = {**env, "FUNNEL_DEVICE": args.device, "FUNNEL_BACKEND": args.backend,
                  "FUNNEL_INTRA_OP_THREADS": "1", "FUNNEL_SPINNING": "0", "FUNNEL_HEARTBEAT_TTL_S": heartbeat_ttl_s}
    workers = served if deployment == "dedicated" else []
    with Stack(model_store=store, models=models, workers=workers, worker_env=worker_env, web_env=env,
               log_dir=log_dir) as stack:
        if deployment == "multi":
            stack.start_worker(",".join(models), FUNNEL_MAX_RESIDENT=str(args.resident))
            stack.wait_ready(120, expected=dict.fromkeys(models, 1))
        yield stack


def kill_mid_load(stack: Stack, doomed, deadline: float) -> bool:
    """kill -9 the worker `doomed` the moment it holds a load claim not yet past its load (the claim's
    TTL above CLAIM_KEPT_S: renewed while loading); True if it was caught loading, else killed anyway at
    the deadline."""
    client = redis.Redis.from_url(stack.redis_url)
    keys, caught = Keys(), False
    pattern = keys.pattern("loading")
    while time.monotonic() < deadline and not caught:
        for key in client.scan_iter(pattern):
            pipe = client.pipeline(transaction=False)
            pipe.get(key)
            pipe.pttl(key)
            holder, ttl_ms = pipe.execute()
            if holder == b"doomed" and ttl_ms > CLAIM_KEPT_S * 1000:
                caught = True
                break
        else:
            time.sleep(0.0005)
    os.kill(doomed.pid, signal.SIGKILL)
    client.close()
    return caught


def cold_starts(stack: Stack, models: list[str], count: int, probe: dict, budget_s: float) -> list[float]:
    """Seconds to answer a request for a model not loaded, one at a time, count times or until budget_s
    has passed: each asks the model used longest ago (with at most `resident` loaded of len(models),
    never resident)."""
    times: list[float] = []
    end = time.monotonic() + budget_s
    for i in range(count):
        if time.monotonic() > end:
            break
        model = models[i % len(models)]
        started = time.perf_counter()
        status, body, _ = http("POST", f"{stack.url}/v1/models/{model}/predict", json_body=probe,
                               headers={"X-Request-Timeout": "30"})
        if status != 200:
            raise RuntimeError(f"cold request to {model}: {status} {body}")
        times.append(time.perf_counter() - started)
    return times


def machine_tag(device: str) -> str:
    """What the results file is named after: the GPU's name on CUDA, else the CPU's cores."""
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
        index = device.partition(":")[2] or "0"
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", index],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            return re.sub(r"[^a-z0-9]+", "-", done.stdout.strip().lower()).strip("-")
    return f"cpu{os.cpu_count()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multiplex", description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=20, help="copies of --base")
    parser.add_argument("--resident", type=int, default=3, help="the multi worker's --max-resident")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of each point's load")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="the workers' --device: cpu, cuda:N")
    parser.add_argument("--backend", default="onnx", choices=["onnx", "torch"],
                        help="the workers' backend: onnx (the toy's ONNX graph) or torch (TorchScript)")
    parser.add_argument("--base", default=copies.TOY,
                        help="what the models are copies of: toy (the toy scorer), or a text model of --store "
                             "with a TorchScript export, such as text-embedding (--backend torch)")
    parser.add_argument("--store", default="model_store", help="the model store --base is read from")
    parser.add_argument("--cold", type=int, default=40, help="cold-start requests (for at most --duration s)")
    parser.add_argument("--note", default="", help="a line about the machine, put under the table")
    args = parser.parse_args(argv)
    if not 0 < args.resident < args.models:
        parser.error("--resident is at least 1 and below --models")
    if args.base != copies.TOY and args.backend != "torch":
        parser.error("copies of a store's model are TorchScript: --base MODEL takes --backend torch")
    models = copies.names(args.base, args.models)
    rows, cold = [], []
    with tempfile.TemporaryDirectory(prefix="funnel-multiplex-") as tmp:
        work = Path(tmp)
        store, probes = make_store(work, args)
        for traffic in ("resident", "uniform", "zipf"):
            weights = weights_of(traffic, args.models, args.resident)
            for deployment in ("multi", "dedicated"):
                served = [m for m, w in zip(models, weights) if w > 0] if deployment == "dedicated" else models
                log_dir = work / f"{traffic}-{deployment}"
                with stack_for(deployment, store, models, served, args, log_dir) as stack:
                    Load(stack.port, models, weights, probes, seed=1).run(args.clients, 2.0)  # warm-up
                    loads = loads_total(stack)
                    load = Load(stack.port, models, weights, probes, seed=2)
                    rate = load.run(args.clients, args.duration)
                    per_minute = (loads_total(stack) - loads) / args.duration * 60
                    if deployment == "multi" and traffic == "uniform":
                        time.sleep(1.0)  # idle: what the load queued is answered
                        cold = cold_starts(stack, models, args.cold, probes.bodies[0], args.duration)
                p50, p99 = percentiles_ms(load.latencies)
                rows.append((traffic, deployment, len(served), rate, p50, p99, load.failed, load.wrong,
                             per_minute if deployment == "multi" else float("nan")))
                print(rows[-1], flush=True)
        killed = kill_point(store, models, probes, args, work / "kill")
    report = render(rows, cold, killed, args)
    save(f"multiplex-{machine_tag(args.device)}", report)
    return 0


def kill_point(store: Path, models: list[str], probes: copies.Probes, args, log_dir: Path) -> dict:
    """Zipf traffic on two multi workers; one is killed (kill -9) mid-load halfway through: what the
    clients saw."""
    weights = weights_of("zipf", args.models, args.resident)
    with stack_for("multi", store, models, models, args, log_dir, heartbeat_ttl_s="2") as stack:
        doomed = stack.start_worker(",".join(models), FUNNEL_MAX_RESIDENT=str(args.resident),
                                    FUNNEL_WORKER_ID="doomed", FUNNEL_HEARTBEAT_TTL_S="2")
        stack.wait_ready(120, expected=dict.fromkeys(models, 2))
        # Warm-up, as at every point: a worker's first load also imports its backend (torch: seconds).
        Load(stack.port, models, weights, probes, seed=1).run(args.clients, 2.0)
        load = Load(stack.port, models, weights, probes, seed=3)
        caught: list[bool] = []
        killer = threading.Thread(target=lambda: (time.sleep(args.duration / 2), caught.append(
            kill_mid_load(stack, doomed, time.monotonic() + args.duration / 4))))
        killer.start()
        rate = load.run(args.clients, args.duration)
        killer.join()
    p50, p99 = percentiles_ms(load.latencies)
    return {"rate": rate, "p50": p50, "p99": p99, "failed": load.failed, "wrong": load.wrong,
            "answered": len(load.latencies), "caught": bool(caught and caught[0])}


def torch_of(args) -> str:
    """The torch that ran the workers, and its GPU: what a torch run's figures depend on."""
    if args.backend != "torch":
        return ""
    import torch

    gpu = f" on {torch.cuda.get_device_name(args.device)}" if args.device.startswith("cuda") else ""
    return f", torch {torch.__version__}{gpu}"


def render(rows, cold: list[float], killed: dict, args) -> str:
    by = {(r[0], r[1]): r for r in rows}
    base = "" if args.base == copies.TOY else f" --base {args.base} --store {args.store}"
    lines = [f"# Many models on one worker: {args.models} copies of {copies.describe(args.base, args.backend)}, "
             f"at most {args.resident} resident", "",
             f"`python -m benchmarks.multiplex --models {args.models} --resident {args.resident} "
             f"--duration {args.duration:g} --clients {args.clients} --device {args.device} --backend {args.backend}"
             f"{base} --cold {args.cold}`", "",
             f"Machine: {machine()}; device {args.device}{torch_of(args)}.", "",
             "| traffic | deployment | workers (models loaded) | req/s | of dedicated | p50 ms | p99 ms "
             "| not 200 | wrong | loads/min |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for traffic, deployment, workers, rate, p50, p99, failed, wrong, per_minute in rows:
        ratio = rate / by[traffic, "dedicated"][3] if by[traffic, "dedicated"][3] else float("nan")
        loaded = args.resident if deployment == "multi" else workers
        lines.append(f"| {traffic} | {deployment} | {1 if deployment == 'multi' else workers} ({loaded}) "
                     f"| {rate:.0f} | {ratio:.2f} | {p50:.1f} | {p99:.1f} | {failed} | {wrong} "
                     f"| {'' if per_minute != per_minute else f'{per_minute:.0f}'} |")
    c50, c99 = percentiles_ms(cold)
    lines += ["", f"Zipf traffic on two multi workers, one killed (kill -9) halfway through "
              f"{'while it loaded a model' if killed['caught'] else 'NOT caught loading (killed anyway)'}: "
              f"{killed['answered']} answered 200 ({killed['rate']:.0f} req/s, p50 {killed['p50']:.1f} ms, p99 "
              f"{killed['p99']:.0f} ms), {killed['failed']} not 200, {killed['wrong']} wrong."]
    lines += ["", f"Cold start (multi worker idle, a request to a model not loaded, {len(cold)} times, the "
              f"load and warm-up included): p50 {c50:.0f} ms, p99 {c99:.0f} ms.", "",
              "`resident`: traffic over the first --resident models only; the dedicated deployment runs a worker "
              "for each of those (the same models loaded as the multi worker). `uniform` and `zipf`: over every "
              "model; the dedicated deployment then holds every model loaded, a worker each. `of dedicated`: "
              "req/s against the dedicated deployment's on the same traffic. The load generator runs in this "
              "process, on the same cores."]
    if args.note:
        lines += ["", args.note]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
