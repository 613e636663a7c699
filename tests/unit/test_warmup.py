"""The worker's warm-up (worker/warmup.py): each batch shape once before registering, bounded on the CPU."""

import time

from funnel.common import tasks
from funnel.common.store import load_spec
from funnel.worker import backend as backends
from funnel.worker import warmup


class Recorded:
    """The real backend, noting the shape of every batch it runs."""

    def __init__(self, inner):
        self.inner, self.shapes = inner, []
        self.description = "recorded"

    def run(self, feeds):
        self.shapes.append(feeds["input_ids"].shape)
        return self.inner.run(feeds)


def text_model(model_store):
    spec = load_spec(model_store, "text-embedding")
    return tasks.load(spec), Recorded(backends.load(spec, "onnx", "cpu"))


def test_batch_sizes_are_the_powers_of_two_cuda_pads_to():
    assert warmup.batch_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert warmup.batch_sizes(24) == [1, 2, 4, 8, 16, 32]  # 24 runs padded to 32 on CUDA
    assert warmup.batch_sizes(1) == [1]


def test_every_batch_size_runs_with_every_text_length_before_registering(model_store):
    task, backend = text_model(model_store)
    warmup.run(task, backend, 4, "cuda:0")  # no budget off the CPU (the device only decides that)
    lengths = [16, 32, 64, 128, 256]  # up to the model's max_tokens
    assert backend.shapes == [(n, t) for n in (1, 2, 4) for t in lengths]


def test_a_cpu_worker_stops_warming_within_its_budget(model_store, monkeypatch):
    monkeypatch.setattr(warmup, "CPU_BUDGET_S", 0.1)
    task, backend = text_model(model_store)
    started = time.perf_counter()
    warmup.run(task, backend, 32, "cpu")
    # All 30 shapes take seconds on the CPU; the warm-up stops near its budget, smallest shapes first.
    assert time.perf_counter() - started < 1.0
    assert backend.shapes[0] == (1, 16) and len(backend.shapes) < 30
