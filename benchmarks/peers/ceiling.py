"""The ceiling: the same model called in-process, batch after batch, no HTTP.

    BENCH_MODEL=... BENCH_IMPL=... python -m benchmarks.peers.ceiling SECONDS RAW_INPUT_FILE

Prints one JSON line: items/s at batch 1 and 32 (predict = collate + run +
postprocess, on inputs preprocessed once), and at batch 32 with every item
preprocessed again from its raw bytes (JPEG decode + resize, or tokenization):
everything a server must do except HTTP. On a CPU, also batch 32 in one
single-threaded process per core side by side (`per_core`): the layout of
Funnel's `a worker per core`, whose own ceiling that is.

BENCH_DEVICE=cuda:N runs the model on that GPU. Every step is synchronous, so the
timings count the GPU's work: predict() returns host data (worker.backend's
TorchBackend.run copies the outputs to numpy with .cpu(), a blocking
device-to-host copy; the eager models call .tolist()).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peers.common import TEXT_MODEL, env_config, load_model


def rate(step, items: int, seconds: float) -> float:
    step()  # warm-up
    step()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        step()
        done += items
    return done / (time.perf_counter() - started)


def per_core(seconds: float, raw_file: str) -> float:
    """Items/s at batch 32 of one single-threaded copy of this script per core, run side by side."""
    env = {**os.environ, "BENCH_THREADS": "1", "BENCH_CEILING_ONLY": "batch32"}
    copies = [subprocess.Popen([sys.executable, "-m", "benchmarks.peers.ceiling", str(seconds), raw_file],
                               env=env, stdout=subprocess.PIPE, text=True) for _ in range(os.cpu_count() or 1)]
    rates = [json.loads(copy.communicate()[0].split("CEILING ", 1)[1])["batch32"] for copy in copies]
    return sum(rates)


def main() -> int:
    seconds = float(sys.argv[1])
    raw = Path(sys.argv[2]).read_bytes()
    config = env_config()
    if config["model"] == TEXT_MODEL:
        raw = json.loads(raw)["text"]
    model = load_model()
    item = model.preprocess(raw)
    if os.environ.get("BENCH_CEILING_ONLY") == "batch32":  # one copy of per_core's
        print("CEILING " + json.dumps({"batch32": rate(lambda: model.predict([item] * 32), 32, seconds)}))
        return 0
    result = {
        "batch1": rate(lambda: model.predict([item]), 1, seconds),
        "batch32": rate(lambda: model.predict([item] * 32), 32, seconds),
        "batch32_pre": rate(lambda: model.predict([model.preprocess(raw) for _ in range(32)]), 32, seconds),
        "description": model.description,
    }
    if config["device"] == "cpu" and not config["threads"]:
        del model  # its threads idle, but its memory is not needed beside the copies
        result["batch32_cores"] = per_core(seconds, sys.argv[2])
    print("CEILING " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
