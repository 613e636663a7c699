"""TorchScript on cuda:0 fed batch sizes (and text lengths) that vary like a live queue's.

    python -m benchmarks.cuda_shapes STORE:MODEL [STORE:MODEL ...]

Run from the repository root, it runs 300 batches of 1..32 items with
TorchScript's optimizing executor on and off (worker/backend.py turns it off on
CUDA), printing the time of the first 50 batches and the steady rate of the
last 250. Each model is loaded bare,
without the power-of-two padding that worker.backend.load adds on CUDA.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np

from funnel.common.store import load_spec
from funnel.worker import backend as backends


def feeds(spec, n: int, rng: random.Random) -> dict[str, np.ndarray]:
    if spec.task == "text_embedding":
        t = rng.randint(8, 40)
        return {"input_ids": np.random.randint(1000, 2000, (n, t)).astype(np.int64),
                "attention_mask": np.ones((n, t), np.int64)}
    return {"pixels": np.random.randint(0, 256, (n, 224, 224, 3), dtype=np.uint8)}


def main(targets: list[str]) -> None:
    for store, name in (t.split(":", 1) for t in targets):
        spec = load_spec(store, name)
        for optimize in (True, False):
            model = backends.TorchBackend(spec, "cuda:0", 0)
            model.optimize = optimize
            rng = random.Random(0)
            sizes = [rng.randint(1, 32) for _ in range(300)]
            items, started, marks = 0, time.perf_counter(), []
            for i, n in enumerate(sizes):
                model.run(feeds(spec, n, rng))
                items += n
                if i in (49, 299):
                    marks.append((items, time.perf_counter() - started))
            (items_50, s_50), (items_300, s_300) = marks
            print(f"{name} optimized_execution={optimize}: first 50 batches {s_50:.2f} s, "
                  f"300 batches {s_300:.2f} s, last 250 batches "
                  f"{(items_300 - items_50) / (s_300 - s_50):.0f} items/s", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cuda_shapes", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("targets", nargs="+", metavar="STORE:MODEL",
                        help="a model store and a model in it")
    main(parser.parse_args().targets)
