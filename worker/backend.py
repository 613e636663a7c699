"""Inference backends: a batch's feeds in, one row per item out (its named outputs).

A task that defines `load` and `predict` runs in Python, in a process of its
own (worker/model_process.py). Otherwise the graph model.json names: ONNX
Runtime (CUDA provider from onnxruntime-gpu on cuda:N, CPU otherwise) or
PyTorch running the frozen TorchScript export, both fed the same feeds. The
worker core never knows which one it runs. fp16 graphs
(`prepare_model.py --half`) are meant for CUDA; both graph backends still run
them on the CPU, slowly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from funnel.common import tasks
from funnel.common.store import ModelSpec
from funnel.worker.cores import CoreLock
from funnel.worker.model_process import ModelProcess

log = logging.getLogger(__name__)

Row = dict[str, Any]  # one item's outputs, by name: what its task's postprocess takes


class Backend(Protocol):
    """What the worker runs a batch with: the batch's feeds in, one row per item out, in order."""

    description: str  # for logs: library, version, device

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Row]: ...

    def close(self) -> None:
        """Let the model go (evicted to make room): what it holds is freed."""


def rows(outputs: Mapping[str, np.ndarray], n: int) -> list[Row]:
    """A graph's outputs, each with one row per item, as each item's row."""
    for name, value in outputs.items():
        if len(value) != n:
            raise RuntimeError(f"model returned {len(value)} rows of {name!r} for {n} inputs")
    return [{name: value[i] for name, value in outputs.items()} for i in range(n)]


def _count(feeds: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(feeds.values())))


def _cuda_index(device: str) -> int | None:
    if device == "cpu":
        return None
    if device.startswith("cuda"):
        return int(device.split(":", 1)[1]) if ":" in device else 0
    raise ValueError(f"unknown device {device!r}: use cpu or cuda:N")


def _warn_if_half_on_cpu(spec: ModelSpec, gpu: int | None, backend: str) -> None:
    if gpu is None and spec.config.get("precision") == "fp16":
        log.warning("%s is an fp16 model, meant for CUDA: %s runs it on the CPU, but slowly "
                    "(serve %s on cuda:N, or its fp32 model on the CPU)", spec.name, backend, spec.name)


class OnnxBackend:
    """ONNX Runtime; with io_binding (default: on CUDA only) feeds and results go
    through an I/O binding, and ONNX Runtime allocates the outputs on the device."""

    def __init__(self, spec: ModelSpec, device: str, threads: int, spinning: bool = True,
                 io_binding: bool | None = None, core_lock: str = ""):
        import onnxruntime as ort

        def options(threads: int, spinning: bool) -> ort.SessionOptions:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if threads:
                options.intra_op_num_threads = threads
            # Idle intra-op threads spin-wait for the next step of a run (off: they sleep, and each
            # step wakes them), and never past its end: between batches the worker replies and
            # takes, and threads spinning then burn the cores the web tier and Redis need.
            options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
            options.add_session_config_entry("session.force_spinning_stop", "1")
            return options

        gpu = _cuda_index(device)
        providers: list = ["CPUExecutionProvider"]
        if gpu is not None:
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError("device is CUDA but this onnxruntime has no CUDA provider: "
                                   "install the gpu extra (onnxruntime-gpu)")
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": gpu}))
        _warn_if_half_on_cpu(spec, gpu, "onnxruntime")
        self.session = ort.InferenceSession(str(spec.file("onnx")), options(threads, spinning), providers=providers)
        # On a share of the cores with a core lock (worker/cores.py): a second session on all of
        # them, spinning within a run as one worker alone would, for a lone item while no other runs.
        self.cores: CoreLock | None = None
        if core_lock and threads and gpu is None:
            try:
                self.cores = CoreLock(core_lock)
            except OSError as exc:  # served all the same, on its share
                log.warning("core lock %s: %s; a lone item runs on this worker's share of the cores", core_lock, exc)
        if self.cores:
            self.whole = ort.InferenceSession(str(spec.file("onnx")), options(0, True), providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.io_binding = gpu is not None if io_binding is None else io_binding
        self.output_device = ("cpu", 0) if gpu is None else ("cuda", gpu)
        self.description = (f"onnxruntime {ort.__version__} {self.session.get_providers()[0]}"
                             + (" io-binding" if self.io_binding else "")
                             + (f", {threads} threads, a lone item on all the cores while no other worker on "
                                f"them runs ({core_lock})" if self.cores else ""))

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Row]:
        return rows(self.outputs(feeds), _count(feeds))

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.io_binding:
            return self._run_bound(feeds)
        if self.cores is None:
            return self._run(self.session, feeds)
        with self.cores.run(lone=_count(feeds) == 1) as alone:
            return self._run(self.whole if alone else self.session, feeds)

    def close(self) -> None:
        pass  # the sessions go with the last reference

    def _run(self, session, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = session.run(self.output_names, {n: feeds[n] for n in self.input_names})
        return dict(zip(self.output_names, outputs))

    def _run_bound(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        binding = self.session.io_binding()
        for name in self.input_names:  # the binding keeps each array alive until it is gone
            binding.bind_cpu_input(name, np.ascontiguousarray(feeds[name]))
        for name in self.output_names:
            binding.bind_output(name, *self.output_device)
        self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.copy_outputs_to_cpu()))


class TorchBackend:
    def __init__(self, spec: ModelSpec, device: str, threads: int, spinning: bool = True):
        import torch

        if threads:
            torch.set_num_threads(threads)
        if "torchscript" not in spec.config:
            raise ValueError(f"{spec.name} has no TorchScript export: serve it with --backend onnx")
        gpu = _cuda_index(device)
        _warn_if_half_on_cpu(spec, gpu, "torch")
        self.torch = torch
        self.device = torch.device("cpu" if gpu is None else f"cuda:{gpu}")
        self.module = torch.jit.load(str(spec.file("torchscript")), map_location=self.device).eval()
        # On CUDA, TorchScript's profiling executor specialises and recompiles for new input
        # shapes, and every batch size is one: with sizes 1-32 in random order on an H100 it ran
        # EfficientNet at 185 items/s, the frozen graph as is at 1709 (benchmarks/cuda_shapes.py).
        self.optimize = gpu is None
        self.input_names = list(spec.config["feeds"])
        self.output_names = list(spec.config["outputs"])
        self.description = f"torch {torch.__version__} {self.device}"

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Row]:
        return rows(self.outputs(feeds), _count(feeds))

    def close(self) -> None:
        pass  # the module goes with the last reference

    def outputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        with torch.inference_mode(), torch.jit.optimized_execution(self.optimize):
            args = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
                    for n in self.input_names]
            result = self.module(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        return {name: t.float().cpu().numpy() for name, t in zip(self.output_names, result)}


class PowerOfTwoBatches:
    """Runs a batch of n as the next power of two (the last item repeated), answers the first n.

    Used on CUDA, where each new input shape costs a one-time setup (kernel plans,
    specialisation) that took seconds per shape for EfficientNet on an H100: a
    queue that forms batches of every size from 1 to 32 paid it 32 times, in
    the middle of serving. Six shapes pay it six times; the extra rows cost a
    GPU next to nothing.
    """

    def __init__(self, inner: Backend):
        self.inner = inner
        self.description = inner.description + ", batches padded to powers of two"

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Row]:
        n = _count(feeds)
        extra = (1 << (n - 1).bit_length()) - n
        if extra:
            feeds = {k: np.concatenate([v, np.repeat(v[-1:], extra, axis=0)]) for k, v in feeds.items()}
        return self.inner.run(feeds)[:n]

    def close(self) -> None:
        self.inner.close()


BACKENDS = {"onnx": OnnxBackend, "torch": TorchBackend}


def name(spec: ModelSpec, backend: str) -> str:
    """What runs the model: "python" for a task with load and predict, "chain" for a chain of models, else
    the graph backend asked for (also for a task that does not import: its load fails, and says why,
    where loads are reported)."""
    try:
        task = tasks.task_class(spec.task)
        return "python" if task.in_python() else "chain" if task.in_chain() else backend
    except ValueError:
        return backend


def load(spec: ModelSpec, backend: str, device: str, threads: int = 0, spinning: bool = True,
         core_lock: str = "", tcmalloc: bool = False) -> Backend:
    if device == "auto":  # the worker resolves auto first (worker/device.py); others get the first GPU
        from funnel.worker.device import cuda_devices

        device = (cuda_devices(backend) or ["cpu"])[0]
    backend = name(spec, backend)
    model: Backend
    if backend == "python":
        model = ModelProcess(spec, device, threads, tcmalloc)
    elif backend == "onnx":
        model = OnnxBackend(spec, device, threads, spinning, core_lock=core_lock)
    else:
        model = BACKENDS[backend](spec, device, threads, spinning)
    if _cuda_index(device) is not None and backend != "python":
        model = PowerOfTwoBatches(model)
    log.info("loaded %s with %s", spec.name, model.description)
    return model
