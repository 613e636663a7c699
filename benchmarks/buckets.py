"""Length buckets: one batch of texts of very different lengths, run padded to its longest, split by the
task's `buckets()`, or one text at a time.

    python -m benchmarks.buckets [--rounds 5] [--batch 32] [--run-costs 16,64,256] [--threads 1]

Run from the repository root. In process, as the worker runs a batch
(`worker.batch`'s collate, run and finish: buckets, then collate, run and postprocess per run), on
the text-embedding model of `model_store` (ONNX on the CPU, one intra-op thread
and no spinning by default, as `funnel up --workers-per-model N` runs it, so that
the CPU time of this process is the batch's cost whatever else the machine runs).
Each mix of lengths is one batch of real texts (the first k words of a passage,
tokenized by the task); every way of running it is timed on the same batch, in
interleaved rounds (the order rotates each round), and the table gives the median
CPU ms and wall ms per batch with the range, and each against one padded run.

The ways: one run padded to the longest (what a task without `buckets()` gets);
the split rule the text task had before (split in two where that saves half
the padded tokens and more than 512, recursively on the short side); the
task's `group_by_width` at several run costs (`run_cost_tokens`, the task's
default marked); and one text per run. The table goes to
benchmarks/results/buckets-<date>.md with the machine it ran on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from benchmarks import save
from benchmarks.machine import cpu_model, loadavg
from funnel.common import tasks
from funnel.common.contracts.wire import Job
from funnel.common.store import load_spec
from funnel.common.tasks import text_embedding
from funnel.common.tasks.buckets import group_by_width
from funnel.worker import backend as backends
from funnel.worker import batch as batching

PASSAGE = ("The quick brown fox jumps over the lazy dog while a man is eating a piece of bread and the girl "
           "is carrying a baby across the sunny park where children play football and old friends talk "
           "about the weather the news and the price of coffee ") * 8

Grouping = Callable[[list[int]], list[list[int]]]


def text_of(tokens: int) -> str:
    """About `tokens` tokens of real text (a word is a token here, plus the two markers)."""
    return " ".join(PASSAGE.split()[:max(1, tokens - 2)])


def mixes(batch: int, seed: int = 0) -> dict[str, list[int]]:
    """Token lengths of each batch mix."""
    rng = np.random.default_rng(seed)
    half, quarter = batch // 2, batch // 4
    return {
        f"{batch - 1} short (~12 tokens) + 1 of 256": [12] * (batch - 1) + [256],
        "spread evenly over 8-256": rng.integers(8, 257, size=batch).tolist(),
        f"{half} of ~16 + {batch - half} of ~200": [16, 200] * half + [200] * (batch - 2 * half),
        f"{batch - quarter} of ~10 + {quarter} of 256": [10] * (batch - quarter) + [256] * quarter,
        "uniform, 18-22 tokens": rng.integers(18, 23, size=batch).tolist(),
    }


def halving_rule(widths: list[int]) -> list[list[int]]:
    """The text task's split before group_by_width: in two where that saves half the padded tokens and
    more than 512, then again on the shorter side."""
    def split(lengths: list[int], order: list[int]) -> list[list[int]]:
        n, whole = len(lengths), len(lengths) * lengths[-1]
        best_k, best_cost = 0, whole
        for k in range(1, n):
            cost = k * lengths[k - 1] + (n - k) * lengths[-1]
            if cost < best_cost:
                best_k, best_cost = k, cost
        saved = whole - best_cost
        if best_k == 0 or saved < whole / 2 or saved < 512:
            return [order]
        return split(lengths[:best_k], order[:best_k]) + [order[best_k:]]

    order = sorted(range(len(widths)), key=widths.__getitem__)
    return split([widths[i] for i in order], order)


def ways(run_costs: list[float]) -> dict[str, Grouping]:
    out: dict[str, Grouping] = {"one run, padded to the longest": lambda w: [list(range(len(w)))],
                                "before: the halving rule": halving_rule}
    for cost in run_costs:
        mark = " (default)" if cost == text_embedding.RUN_COST_TOKENS else ""
        out[f"group_by_width, run cost {cost:g} tokens{mark}"] = \
            lambda w, cost=cost: group_by_width(w, cost)
    out["one text per run"] = lambda w: [[i] for i in range(len(w))]
    return out


def timed(jobs: list[Job], task, backend, grouping: Grouping) -> tuple[float, float, int]:
    """(CPU ms, wall ms) for the worker to run the batch with this grouping, and its number of runs."""
    widths = [len(job.items[0]["input_ids"]) for job in jobs]
    groups = grouping(widths)
    task.buckets = lambda items: groups  # the worker asks the task; the grouping is computed outside the clock
    cpu, wall = time.process_time(), time.perf_counter()
    batch = batching.Batch(jobs=jobs)
    batching.collate(batch, task, "bench")
    batching.run(batch, task, backend)
    batching.finish(batch, task, "bench")
    return (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000, len(groups)


def measure(jobs: list[Job], task, backend, candidates: dict[str, Grouping], rounds: int
            ) -> dict[str, tuple[list[float], list[float], int]]:
    """Each way's CPU and wall ms per batch over interleaved rounds, and its number of runs."""
    for grouping in candidates.values():  # warm up every shape once
        timed(jobs, task, backend, grouping)
    out: dict[str, tuple[list[float], list[float], int]] = {name: ([], [], 0) for name in candidates}
    names = list(candidates)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu, wall, runs = timed(jobs, task, backend, candidates[name])
            out[name] = (out[name][0] + [cpu], out[name][1] + [wall], runs)
    return out


def cell(values: list[float], base: float) -> str:
    median = statistics.median(values)
    return f"{median:.0f} [{min(values):.0f}-{max(values):.0f}] | {median / base:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--run-costs", default="16,64,256", help="run costs (tokens) of group_by_width to compare")
    p.add_argument("--backend", default="onnx", choices=["onnx", "torch"])
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (0: the library's default)")
    p.add_argument("--store", default="model_store")
    args = p.parse_args()
    run_costs = [float(c) for c in args.run_costs.split(",")]

    spec = load_spec(args.store, "text-embedding")
    task = tasks.load(spec)
    backend = backends.load(spec, args.backend, "cpu", threads=args.threads, spinning=args.threads == 0)
    lines = [f"# Length buckets, {dt.datetime.now():%Y-%m-%d %H:%M}", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()} "
             f"(load average before: {loadavg()}); text-embedding, {backend.description}, "
             f"{args.threads or 'the library default'} intra-op thread(s); `python -m benchmarks.buckets "
             f"--rounds {args.rounds} --batch {args.batch} --run-costs {args.run_costs} --backend {args.backend} "
             f"--threads {args.threads}`", "",
             f"One batch of {args.batch} texts per mix, run as `worker.batch._infer` runs it (collate, run, "
             f"postprocess per run); median CPU ms and wall ms per batch over {args.rounds} interleaved rounds "
             f"[min-max], each against one padded run (lower is better).", ""]
    for mix, lengths in mixes(args.batch).items():
        jobs = [Job(id=str(i), model=spec.name, items=[task.preprocess(text_of(n))], reply_to="",
                    deadline=0)
                for i, n in enumerate(lengths)]
        tokens = sorted(len(job.items[0]["input_ids"]) for job in jobs)
        results = measure(jobs, task, backend, ways(run_costs), args.rounds)
        padded_cpu, padded_wall = (statistics.median(v) for v in next(iter(results.values()))[:2])
        lines += [f"## {mix}", "",
                  f"Tokens per text: min {tokens[0]}, median {tokens[len(tokens) // 2]}, max {tokens[-1]}; "
                  f"{len(tokens) * tokens[-1]} padded tokens in one run, {sum(tokens)} real.", "",
                  "| way | runs | CPU ms per batch | vs one padded run | wall ms | vs one padded run |",
                  "|---|---|---|---|---|---|"]
        for name, (cpu, wall, runs) in results.items():
            lines.append(f"| {name} | {runs} | {cell(cpu, padded_cpu)} | {cell(wall, padded_wall)} |")
        lines.append("")
    lines.append(f"Load average after: {loadavg()}.")
    save("buckets", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
