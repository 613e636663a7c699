"""The results of one model: a Markdown report (printed too), the raw rounds as JSON, and the plots,
under benchmarks/results/bench-<model>-<date>.*"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import sys
from pathlib import Path

from benchmarks import RESULTS
from benchmarks.plots import plot_suite
from benchmarks.stats import med, summarize
from benchmarks.systems import LABELS, PEERS, systems_of


def write_report(model: str, args, info: dict, command: str, stamp: dt.datetime,
                 rounds: list[dict]) -> list[Path]:
    """Write (and print) bench-<model>-<date>.md, .json and the plots; the paths written."""
    base = f"bench-{model}-{stamp:%Y%m%d-%H%M}"
    parts = header(model, args, info, command, stamp, rounds)
    written = []
    raw = {"model": model, "command": command, "machine": info, "date": stamp.isoformat(), "rounds": rounds,
           "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, list))}}
    json_path = RESULTS / f"{base}.json"  # first: the measurements outlive a failure to render them
    json_path.write_text(json.dumps(raw, indent=1, default=str))
    for suite in args.suites:
        pairs = [p for p in systems_of(suite, args.backend) if p[0] in args.system_list]
        summary = summarize(rounds, suite, pairs, args.concurrency_list)
        label = f"same-{args.backend}" if suite == "same" else "default"
        try:
            plots = plot_suite(model, label, summary, pairs, args.concurrency_list, f"{base}-{label}")
        except ImportError as exc:  # matplotlib missing: the table still counts
            print(f"no plots: {exc}", file=sys.stderr)
            plots = {}
        parts.append(report_suite(model, suite, args.backend, summary, pairs, args.concurrency_list, plots))
        written += [RESULTS / f for f in plots.values()]
    md_path = RESULTS / f"{base}.md"
    md_path.write_text("\n".join(parts))
    print("\n".join(parts))
    return [md_path, json_path, *written]


def header(model: str, args, info: dict, command: str, stamp: dt.datetime, rounds: list[dict]) -> list[str]:
    """The report's paragraphs before the tables: machine, device, command, method, columns, settings."""
    pkgs = info["packages"]
    by_kind: dict[str, set[str]] = {}
    for r in rounds:
        for suite in r.values():
            for name, res in suite.items():
                if not name.startswith("ceiling:"):
                    by_kind.setdefault(res["payload"], set()).add(name.split(":")[0])
    payloads = [f"{kind} to {', '.join(sorted(systems))}" for kind, systems in sorted(by_kind.items())]
    web = args.web_processes
    accelerator = "cpu" if args.device == "cpu" else "cuda"
    machine = (
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, {info['os']}; "
        f"onnxruntime {pkgs['onnxruntime']}, torch {pkgs['torch']}, transformers {pkgs['transformers']}, "
        f"numpy {pkgs['numpy']}, Pillow-SIMD {pkgs['pillow-simd']}; Flask {pkgs['flask']}, gunicorn "
        f"{pkgs['gunicorn']}, gevent {pkgs['gevent']}, service_streamer {pkgs['service_streamer']}, "
        f"litserve {pkgs['litserve']} (fastapi {pkgs['fastapi']}, uvicorn {pkgs['uvicorn']}); "
        f"{info['wrk']}.")
    device = (
        f"Device: {args.device}" + (f" ({info['gpu']})" if info.get("gpu") else "")
        + f"; model store: {args.store}; web processes: "
        + (f"{web} for every system (--web-processes)." if web else "each system's default (below).")
        + (f" Funnel's web tier also had {', '.join(f'{k}={v}' for k, v in args.funnel_env.items())}."
           if args.funnel_env else ""))
    quick = [("**Quick smoke run** (--quick: 2 s per point, one round): it shows that the harness works, "
              "not how the systems compare."), ""] if args.quick else []
    method = (
        f"Method: wrk -t1 -c<clients> -d{args.duration:g}s --timeout 30s --latency with a Lua script that "
        f"POSTs the same body every time ({'; '.join(payloads)}); {args.warmup:g} s of wrk at "
        f"{min(32, max(args.concurrency_list))} clients "
        f"warm each system up after it first answers correctly (checked: a 384-d normalised vector, or a "
        f"cat class first); before every point the driver waits until the system has worked off what the "
        f"last run left queued (its processes below 0.25 cores), then {args.settle:g} s more. "
        f"{args.rounds} round(s): within a round each system is started, measured at every concurrency and "
        f"stopped before the next starts; the order of the systems rotates by one every round and the "
        f"concurrency sweep is reversed every other round, so that drifts in the machine's load hit every "
        f"system alike. Figures are medians over rounds, [min–max] of requests/s where there was more "
        f"than one.")
    columns = (
        "Columns: *vs ceiling b32* divides by the in-process batch-32 rate of the same model implementation; "
        "*vs best peer* by the best of the peers measured (Flask, service-streamer, LitServe, infinity, "
        "Ray Serve) at the same concurrency. "
        "*CPU ms/req* is user+system CPU from /proc/<pid>/stat of each process tree over the measured "
        "run, divided by the requests answered: web = HTTP processes (gunicorn master and workers, "
        "LitServe's server and API processes), model = the model process(es) (Flask: inside the web "
        "workers; Funnel's Python path: the workers with the model process under each), redis = the "
        "system's private redis-server. *req/s per web core* is 1000 / web CPU ms "
        "per request: the requests one core of web tier can carry (not for Flask, whose web workers "
        "run the model). *other load* is the rest of the machine's "
        "busy CPU during the point (other jobs, the driver; wrk excluded) in cores: above ~0.1 the point "
        "was disturbed.")
    settings = (
        f"Settings: Flask: gunicorn -w {web or 2} sync workers, 1 intra-op thread each, no batching. "
        f"service-streamer: RedisStreamer in gunicorn -k gevent -w {web or 2}, run_redis_workers_forever "
        "with 1 model worker, batch 32, max latency 20 ms, its own redis-server; preprocessing in the web "
        "processes (suite 'default': raw inputs to the model worker, as its examples do). LitServe: "
        f"max_batch_size 32, batch_timeout 0.02 s, one inference worker (accelerator {accelerator}), "
        + (f"num_api_servers={web}" if web else "one API server (its default)")
        + ", preprocessing in decode_request (inference worker). Funnel: funnel.scripts.stack.Stack "
        f"with default settings ({f'{web} web processes' if web else 'a web process per two cores, at least two'}, "
        "the asgi worker class: an event loop each, "
        "the workers `funnel up` chooses for the host (scripts/layout.py: on a CPU-only host of at least "
        "two cores, two, each with half the cores' intra-op threads and no spin-waiting; one on a GPU), "
        "batch size from model.json, linger 5 ms). Peers' model processes "
        "and the ceiling use the library's default intra-op threads. Funnel (one worker on all the cores): "
        "the same stack with one worker for the model (`funnel up --workers-per-model 1`), library-default "
        "intra-op threads, spin-waiting within a run. infinity (text only): `infinity_emb v2`, its torch "
        "engine, batch 32, one process (its CPU counted as web, the model included); Ray Serve (text "
        "only): @serve.batch of 32 with a 20 ms wait, one replica, sentence-transformers; both on the "
        "all-MiniLM-L6-v2 weights Funnel's model is exported from, in PyTorch, whatever the suite (rows "
        "marked eager), from their own environment (.venv-peers). Funnel, your model in Python (suite "
        "'default', text only): the same stack serving the eagerminilm walkthrough (tests/third_party, "
        "`funnel add minilm --task eagerminilm.tasks:Embedder`, batch size 32): tokenizing in the web tier, "
        "the task's load and predict (transformers AutoModel, mean pooling, torch eager) in a process of "
        "the model's own under each worker, with the worker's intra-op threads as OMP_NUM_THREADS.")
    return [f"# {model}: Funnel against its peers, {stamp:%Y-%m-%d %H:%M}", "", machine, "", device, "",
            f"Command: `{command}`", "", *quick, method, "", columns, "", settings, ""]


def suite_title(suite: str, backend: str) -> str:
    if suite == "same":
        return (f"Same backend ({backend}): every system serves Funnel's exported model through "
                f"worker.backend ({backend}) and the task modules")
    return ("What a user gets by default: the peers with PyTorch eager as their docs show, "
            "Funnel as it ships (ONNX)")


def fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def per_core_lines(points: dict, ceiling: dict) -> list[str]:
    """Funnel's default (on a CPU host, a worker per share of the cores) against the ceiling of a process
    per core."""
    cores = ceiling.get("batch32_cores")
    if not cores or math.isnan(cores):
        return []
    return [f"{LABELS['funnel']} at {c} clients: {point['rps'] / cores:.2f} of the per-core ceiling "
            f"({cores:.0f} items/s, the column above)." for c, point in points.items() if isinstance(c, int)]


def batch_lines(whose: str, funnel: dict) -> list[str]:
    """The batch sizes of one of Funnel's rows: sampled answers at 32 clients, and its workers' counters."""
    lines = []
    sizes = funnel.get("batch_sample_c32")
    if sizes:
        lines.append(f"{whose} batch sizes at 32 clients, from meta.batch_size of {len(sizes)} answers "
                     f"(request-weighted): median {med(sizes):.0f}, mean {statistics.mean(sizes):.1f}, "
                     f"min {min(sizes)}, max {max(sizes)}.")
    for c, hist in sorted(funnel.get("batch_hist", {}).items()):
        buckets = sorted(hist, key=lambda k: int(k.rsplit("_", 1)[1]))
        lines.append(f"{whose} worker counters during the {c}-client runs (batches per size bucket): "
                     + ", ".join(f"≤{k.rsplit('_', 1)[1]}: {hist[k]:.0f}" for k in buckets if hist[k])
                     + ".")
    return lines


def report_suite(model: str, suite: str, backend: str, summary: dict, pairs, concurrency,
                 plots: dict[str, str]) -> str:
    lines = [f"## {suite_title(suite, backend)}", ""]
    ceilings = {name.split(":")[1]: v for name, v in summary.items() if name.startswith("ceiling:")}
    if ceilings:
        lines += [("In-process ceiling, no HTTP (items/s; predict = collate + run + postprocess on an "
                   "input preprocessed once; the last column preprocesses every item again):"), "",
                  ("| model implementation | batch 1 | batch 32 [min–max] | batch 32 incl. preprocessing | "
                   "batch 32, a single-threaded process per core | other load (cores) |"),
                  "|---|---|---|---|---|---|"]
        for impl, v in ceilings.items():
            lines.append(f"| {impl}: {v['description']} | {fmt(v['batch1'])} | {fmt(v['batch32'])} "
                         f"[{fmt(v['range32'][0])}–{fmt(v['range32'][1])}] | {fmt(v['batch32_pre'])} | "
                         f"{fmt(v.get('batch32_cores'))} | {fmt(v['other_cores'], 2)} |")
        lines.append("")

    def ceiling_of(impl):
        return ceilings.get(impl, {}).get("batch32")

    lines += [("| system | clients | req/s [min–max] | p50 ms | p99 ms | non-2xx / socket err | "
               "vs ceiling b32 | vs best peer | CPU ms/req web | model | redis | req/s per web core | "
               "Funnel mean batch | other load (cores) |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in concurrency:
        peers = [summary[f"{s}:{i}"][c]["rps"] for s, i in pairs
                 if s in PEERS and c in summary.get(f"{s}:{i}", {})]
        best_peer = max(peers) if peers else None
        for system, impl in pairs:
            if system == "ceiling":
                continue
            point = summary.get(f"{system}:{impl}", {}).get(c)
            if not point:
                continue
            ceiling = ceiling_of(impl)
            cpu = point["cpu"]
            web = cpu.get("web")
            model_cpu = "in web" if system == "flask" else fmt(cpu.get("model"), 1)
            # What one core of web tier carries; Flask's web processes run the model too.
            per_web_core = 1000 / web if web and system != "flask" else None
            lo, hi = point["rps_range"]
            rng = f" [{lo:.0f}–{hi:.0f}]" if point["n"] > 1 else ""
            lines.append(
                f"| {LABELS[system]} ({impl}) | {c} | {point['rps']:.1f}{rng} | {fmt(point['p50_ms'], 1)} | "
                f"{fmt(point['p99_ms'], 1)} | {point['non2xx']} / {point['socket_errors']} | "
                f"{fmt(point['rps'] / ceiling if ceiling else None, 2)} | "
                f"{fmt(point['rps'] / best_peer if best_peer else None, 2)} | {fmt(web, 2)} | {model_cpu} | "
                f"{fmt(cpu.get('redis'), 2)} | {fmt(per_web_core)} | {fmt(point['mean_batch'], 1)} | "
                f"{point['other_cores']:.2f} |")
    lines.append("")
    lines += per_core_lines(summary.get(f"funnel:{backend}", {}), ceilings.get(backend, {}))
    lines += batch_lines("Funnel's", summary.get(f"funnel:{'onnx' if suite == 'default' else backend}", {}))
    lines += batch_lines("Funnel's Python path's", summary.get("funnel-python:eager", {}))
    lines.append("")
    for title, file in plots.items():
        lines.append(f"![{title}]({file})")
    lines.append("")
    return "\n".join(lines)
