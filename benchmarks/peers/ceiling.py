"""The ceiling: the same model called in-process, batch after batch, no HTTP.

    BENCH_MODEL=... BENCH_IMPL=... python -m benchmarks.peers.ceiling SECONDS RAW_INPUT_FILE

Prints one JSON line: items/s at batch 1 and 32 (predict = collate + run +
postprocess, on inputs preprocessed once), and at batch 32 with every item
preprocessed again from its raw bytes (JPEG decode + resize, or tokenization):
everything a server must do except HTTP.

BENCH_DEVICE=cuda:N runs the model on that GPU. Every step is synchronous, so the
timings count the GPU's work: predict() returns host data (worker.backend's
TorchBackend.run copies the outputs to numpy with .cpu(), a blocking
device-to-host copy; the eager models call .tolist()).
"""

from __future__ import annotations

import json
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


def main() -> int:
    seconds = float(sys.argv[1])
    raw = Path(sys.argv[2]).read_bytes()
    config = env_config()
    if config["model"] == TEXT_MODEL:
        raw = json.loads(raw)["text"]
    model = load_model()
    item = model.preprocess(raw)
    result = {
        "batch1": rate(lambda: model.predict([item]), 1, seconds),
        "batch32": rate(lambda: model.predict([item] * 32), 32, seconds),
        "batch32_pre": rate(lambda: model.predict([model.preprocess(raw) for _ in range(32)]), 32, seconds),
        "description": model.description,
    }
    print("CEILING " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
