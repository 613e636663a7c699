"""torch eager on the CPU with glibc's malloc against tcmalloc: what preloading it buys a model's process.

    python -m benchmarks.allocator [--models text,image] [--batches 1,8,32] [--seconds 6] [--rounds 2]

The worker preloads tcmalloc (worker/allocator.py) into the torch backend's
worker and into the process of every model in Python (worker/model_process.py).
This runs a model's own eager code, one thread, in a fresh process per point,
as a model's process runs it: with glibc's malloc, then with tcmalloc
preloaded, alternating within each round. Models: `text`, the eagerminilm
walkthrough's `embed` (tests/third_party); `image`, EfficientNet-Lite0 as
benchmarks/peers/common.py's EagerImage runs it. Each point prints items/s and
the CPU's share spent in the kernel (glibc returning and fetching pages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import ROOT, save
from benchmarks.core import machine
from benchmarks.payloads import SENTENCE
from benchmarks.systems import walkthrough_path
from funnel.worker.allocator import tcmalloc_path


def point(model: str, batch: int, seconds: float) -> dict[str, float]:
    """One model at one batch size in this process, one thread: items/s, user and kernel CPU shares."""
    import resource

    import numpy as np
    import torch

    torch.set_num_threads(1)
    if model == "text":
        from eagerminilm import minilm  # tests/third_party, on measure()'s PYTHONPATH

        folder = minilm.weights_folder()
        net = minilm.load_model(folder)
        ids, mask = minilm.pad([np.asarray(minilm.tokenizer(folder).encode(SENTENCE).ids)] * batch)

        def step() -> None:
            minilm.embed(net, ids, mask)
    else:
        from benchmarks.peers.common import EagerImage

        classifier = EagerImage(1, "cpu")
        images = [np.random.default_rng(i).random((3, 224, 224), dtype=np.float32) for i in range(batch)]

        def step() -> None:
            classifier.predict(images)
    step()
    step()
    before, runs, started = resource.getrusage(resource.RUSAGE_SELF), 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        runs += 1
    took, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    return {"items_s": runs * batch / took, "user": (after.ru_utime - before.ru_utime) / took,
            "kernel": (after.ru_stime - before.ru_stime) / took}


def measure(model: str, batch: int, seconds: float, preload: str) -> dict[str, float]:
    """point() in a fresh process, with `preload` as its LD_PRELOAD ("" for glibc's malloc)."""
    env = {**os.environ, "LD_PRELOAD": preload, "OMP_NUM_THREADS": "1", **walkthrough_path()}
    done = subprocess.run([sys.executable, "-m", "benchmarks.allocator", "--point", model, str(batch), str(seconds)],
                          env=env, capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="text,image")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--point", nargs=3, help=argparse.SUPPRESS)  # model batch seconds: one point, as JSON
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(point(args.point[0], int(args.point[1]), float(args.point[2]))))
        return 0
    library = tcmalloc_path()
    if not library:
        raise SystemExit("tcmalloc is not installed (Debian: libtcmalloc-minimal4)")
    models, batches = args.models.split(","), [int(b) for b in args.batches.split(",")]
    found: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for model in models:
            for batch in batches:
                order = ("glibc", "tcmalloc") if round_ % 2 == 0 else ("tcmalloc", "glibc")
                for allocator in order:
                    result = measure(model, batch, args.seconds, library if allocator == "tcmalloc" else "")
                    found.setdefault((model, batch, allocator), []).append(result)
                    print(f"round {round_ + 1} {model} batch {batch} {allocator}: {result['items_s']:.1f} items/s, "
                          f"kernel {result['kernel']:.2f}", flush=True)
    table = ["| model | batch | glibc items/s [each round] | kernel share | tcmalloc items/s [each round] "
             "| kernel share | tcmalloc against glibc |", "|---|---|---|---|---|---|---|"]
    for model in models:
        for batch in batches:
            glibc, tc = found[(model, batch, "glibc")], found[(model, batch, "tcmalloc")]

            def rate(runs: list[dict[str, float]]) -> str:
                each = ", ".join(f"{r['items_s']:.1f}" for r in runs)
                return f"{statistics.median(r['items_s'] for r in runs):.1f} [{each}]"

            def kernel(runs: list[dict[str, float]]) -> str:
                return f"{statistics.median(r['kernel'] for r in runs):.2f}"

            ratio = statistics.median(r["items_s"] for r in tc) / statistics.median(r["items_s"] for r in glibc)
            name = "MiniLM (eagerminilm)" if model == "text" else "EfficientNet-Lite0 (efficientnet_lite_pytorch)"
            table.append(f"| {name} | {batch} | {rate(glibc)} | {kernel(glibc)} | {rate(tc)} | {kernel(tc)} "
                         f"| {ratio:.2f}x |")
    command = " ".join(["python -m benchmarks.allocator", *(argv if argv is not None else sys.argv[1:])])
    save("allocator", f"# torch eager with glibc's malloc and with tcmalloc, {time.strftime('%Y-%m-%d %H:%M')}\n\n"
                      f"Machine: {machine()}\n\nCommand: `{command}`: one thread, a fresh process per point, "
                      f"{args.seconds:g} s each, the two allocators alternating; medians over "
                      f"{args.rounds} round(s). tcmalloc: {library}.\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
