"""Funnel against its peers, same machine, same model: throughput, latency and CPU per request.

    python -m benchmarks.bench [--models text-embedding,image-classifier] [--suite same,default]
                               [--backend onnx|torch] [--concurrency 1,8,32,128] [--duration 10]
                               [--rounds 3] [--systems ceiling,flask,streamer,litserve,funnel] [--quick]
                               [--device cpu|cuda:N] [--store PATH] [--web-processes N]
                               [--funnel-env FUNNEL_X=value ...]

Run from the repository root (benchmarks/ is not installed; Funnel is, as funnel.*).

Systems (each started as subprocesses on free ports of 127.0.0.1, stopped after its run):
  ceiling   the model called in-process, batch 1 and batch 32, no HTTP
  flask     plain Flask, gunicorn -w 2 (sync), one model per process, 1 intra-op thread, no batching
  streamer  service-streamer RedisStreamer: gunicorn -k gevent -w 2 + 1 model worker
            (batch 32, max latency 20 ms), its own private Redis
  litserve  LitServe, max_batch_size 32, batch_timeout 0.02 s
  funnel    funnel.scripts.stack.Stack with default settings (what `make up` starts), serving this model
  funnel-one    the same with one worker for the model, its threads on all the cores (`funnel up
                --workers-per-model 1`, the layout before scripts/layout.py; CPU only)
  funnel-python the same stack serving the eagerminilm walkthrough (tests/third_party) through Funnel's
                Python path: the task's load and predict, torch eager, in a process under each worker
                (suite default, text only)
--web-processes N gives every web tier N processes (gunicorn -w N, LitServe num_api_servers=N,
FUNNEL_PROCESSES=N); --device cuda:N puts every model (peers, ceiling, Funnel's worker) on that GPU.

Suites:
  same      every system serves Funnel's exported model (model_store) through worker.backend
            (--backend onnx or torch) and its Task: only the serving layer differs
  default   the peers as their docs show them, PyTorch eager; Funnel as it ships (ONNX)

Each system is driven by wrk (-t1, a Lua script POSTing one sentence or the cat JPEG, --latency)
at each concurrency; requests/s, p50/p99, non-2xx and socket errors, and the CPU seconds its
web tier, model process(es) and Redis used (from /proc/<pid>/stat) are recorded. Results go to
benchmarks/results/bench-<model>-<date>.md (+ .json, + PNG plots).

The parts: systems.py starts and stops each system, measure.py runs one system for one round,
load.py drives wrk, cpu.py reads CPU time from /proc, stats.py takes medians over rounds,
report.py and plots.py write the results; this file is the command line and the rounds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from benchmarks import RESULTS, ROOT
from benchmarks.machine import gpu_name, loadavg, machine, version
from benchmarks.measure import run_ceiling, run_system
from benchmarks.payloads import MANY_TEXTS, MODELS, TEXT, cat_jpeg, payload
from benchmarks.report import write_report
from benchmarks.systems import EMBEDDING_PEERS, LABELS, SYSTEMS, systems_of


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--suite", default="same", help="same, default, or both: same,default")
    parser.add_argument("--backend", default="onnx", choices=("onnx", "torch"),
                        help="backend of the 'same' suite")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--concurrency", default="1,8,32,128")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each wrk point")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds of wrk at 32 clients before measuring")
    parser.add_argument("--settle", type=float, default=4.0,
                        help="idle seconds before each point (and after it, for Funnel's counters)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the table gives medians and ranges")
    parser.add_argument("--batch-samples", type=int, default=400,
                        help="answers sampled at 32 clients for Funnel's batch-size distribution")
    parser.add_argument("--quick", action="store_true",
                        help="smoke check: 2 s per point, 1 and 32 clients, 1 round")
    parser.add_argument("--texts", type=int, default=1,
                        help="sentences a request (text only; > 1: Funnel, infinity and Ray Serve), e.g. 32 at "
                             "--concurrency 4, where a server's per-request cost is amortised")
    parser.add_argument("--keep-logs", action="store_true", help="keep the systems' logs and wrk outputs")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda:N: where every system runs the model (peers, ceiling, Funnel)")
    parser.add_argument("--store", default=str(ROOT / "model_store"), help="model store of every system")
    parser.add_argument("--web-processes", type=int, default=None, metavar="N",
                        help="web processes of every system (gunicorn -w, LitServe num_api_servers, "
                             "FUNNEL_PROCESSES); default: each system's own (2, 2, 1, 2)")
    parser.add_argument("--funnel-env", action="append", default=[], metavar="FUNNEL_X=VALUE",
                        help="a setting for Funnel (repeatable; each tier reads its own), e.g. FUNNEL_SPINNING=1")
    args = parser.parse_args(argv)
    if any(not re.fullmatch(r"FUNNEL_[A-Z_]+=.*", kv) for kv in args.funnel_env):
        parser.error("--funnel-env takes FUNNEL_NAME=value")
    args.funnel_env = dict(kv.split("=", 1) for kv in args.funnel_env)
    if args.quick:
        args.duration, args.warmup, args.rounds, args.concurrency = 2.0, 2.0, 1, "1,32"
        args.batch_samples = min(args.batch_samples, 192)
    args.model_list = [m for m in args.models.split(",") if m]
    args.suites = [s for s in args.suite.split(",") if s]
    args.system_list = [s for s in args.systems.split(",") if s]
    if args.device != "cpu" and "--systems" not in (argv or sys.argv):  # one worker is the default on a GPU
        args.system_list.remove("funnel-one")
    args.concurrency_list = [int(c) for c in args.concurrency.split(",")]
    for name, values, known in (("model", args.model_list, MODELS),
                                ("suite", args.suites, ("same", "default")),
                                ("system", args.system_list, SYSTEMS)):
        unknown = [v for v in values if v not in known]
        if unknown:
            parser.error(f"unknown {name} {unknown}; known: {', '.join(known)}")
    if args.texts > 1 and (args.model_list != [TEXT] or set(args.system_list) - set(MANY_TEXTS)):
        parser.error(f"--texts {args.texts}: --models {TEXT} and --systems of {', '.join(MANY_TEXTS)} only")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        parser.error(f"--device {args.device!r}: cpu or cuda:N")
    if args.web_processes is not None and args.web_processes < 1:
        parser.error("--web-processes must be at least 1")
    args.store = str(Path(args.store).resolve())
    onnx = sorted({f"{s}:{i}" for suite in args.suites for s, i in systems_of(suite, args.backend)
                   if i == "onnx" and s in args.system_list})
    if args.device != "cpu" and onnx and version("onnxruntime-gpu") == "not installed":
        parser.error(f"--device {args.device}: {', '.join(onnx)} would run ONNX on the GPU, but "
                     "onnxruntime-gpu is not installed (the default suite serves Funnel with ONNX): "
                     "use --suite same --backend torch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so that every system started so far is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now()
    command = "python -m benchmarks.bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    info = machine()
    info["gpu"] = gpu_name(args.device) if args.device != "cpu" else None
    if args.web_processes:
        LABELS["flask"] = f"Flask + gunicorn -w{args.web_processes}, no batching"
    workdir = Path(tempfile.mkdtemp(prefix="funnel-bench-"))
    log = open(workdir / "wrk.log", "a")
    jpeg = cat_jpeg()
    print(f"bench: {info['cpu']}, {info['cores']} cores; logs in {workdir}", flush=True)

    written = []
    ok = False
    try:
        for model in args.model_list:
            rounds = measure_model(model, args, workdir, jpeg, log)
            written += write_report(model, args, info, command, stamp, rounds)
        ok = True
    finally:
        log.close()
        if ok and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"logs kept in {workdir}", file=sys.stderr)
    for path in written:
        print(f"saved {path.relative_to(ROOT)}")
    return 0


def measure_model(model: str, args, workdir: Path, jpeg: bytes, log) -> list[dict]:
    """Every round of every system serving this model: rounds[r][suite][system:impl] = one run's result."""
    rounds: list[dict] = []
    plan = [(suite, pair) for suite in args.suites for pair in systems_of(suite, args.backend)
            if pair[0] in args.system_list and (model == TEXT or pair[0] not in EMBEDDING_PEERS)]
    distinct = {pair for _, pair in plan}
    servers = sum(1 for s, _ in distinct if s != "ceiling")
    estimate = args.rounds * (
        servers * (20 + args.warmup + len(args.concurrency_list) * (args.settle + args.duration + 1))
        + (len(distinct) - servers) * (10 + 3 * args.duration))
    print(f"{model}: {len(distinct)} systems x {args.rounds} round(s), about {estimate / 60:.0f} min",
          flush=True)
    for r in range(args.rounds):
        # Rotate the order of the systems every round and reverse the concurrency sweep
        # every other round, so that slow drifts of the machine hit every system alike.
        order = plan[r % len(plan):] + plan[:r % len(plan)]
        conc = args.concurrency_list if r % 2 == 0 else args.concurrency_list[::-1]
        rounds.append({})
        for suite, (system, impl) in order:
            name = f"{system}:{impl}"
            if name in rounds[r].setdefault(suite, {}):
                continue
            # A system run serves both suites when they name the same (system, impl).
            shared = [s for s, p in plan if p == (system, impl)]
            print(f"[{model} round {r + 1}/{args.rounds}] {LABELS[system]} ({impl}); "
                  f"load average {loadavg()}", flush=True)
            data = payload(model, system, jpeg, args.texts)
            if system == "ceiling":
                result = run_ceiling(model, impl, args, workdir, data, log)
                print(f"    batch 1 {result['batch1']:.1f}, batch 32 {result['batch32']:.1f}, "
                      f"batch 32 with preprocessing {result['batch32_pre']:.1f} items/s", flush=True)
            else:
                result = run_system(system, model, impl, args, conc, workdir, data, log)
            result["payload"] = data.kind
            for s in shared:
                rounds[r].setdefault(s, {})[name] = result
    return rounds


if __name__ == "__main__":
    sys.exit(main())
