"""Inference backends: named numpy feeds in, named numpy outputs out.

ONNX Runtime (CUDA provider from onnxruntime-gpu on cuda:N, CPU otherwise) or
PyTorch running the frozen TorchScript export. Both take the same feeds, so
the worker core never knows which one it runs.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


def _cuda_index(device: str) -> int | None:
    if device == "cpu":
        return None
    if device.startswith("cuda"):
        return int(device.split(":", 1)[1]) if ":" in device else 0
    raise ValueError(f"unknown device {device!r}: use cpu or cuda:N")


class OnnxBackend:
    def __init__(self, spec, device: str, threads: int, spinning: bool = True):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        if not spinning:
            # Idle intra-op threads spin-wait by default: on a CPU shared with the
            # web tier and Redis, that burns the cores they need.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        gpu = _cuda_index(device)
        providers: list = ["CPUExecutionProvider"]
        if gpu is not None:
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError("device is CUDA but this onnxruntime has no CUDA provider: "
                                   "install the gpu extra (onnxruntime-gpu)")
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": gpu}))
        self.session = ort.InferenceSession(str(spec.file("onnx")), options, providers=providers)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.description = f"onnxruntime {ort.__version__} {self.session.get_providers()[0]}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.session.run(self.output_names, {n: feeds[n] for n in self.input_names})
        return dict(zip(self.output_names, outputs))


class TorchBackend:
    def __init__(self, spec, device: str, threads: int, spinning: bool = True):
        import torch

        if threads:
            torch.set_num_threads(threads)
        if "torchscript" not in spec.config:
            raise ValueError(f"{spec.name} has no TorchScript export: serve it with --backend onnx")
        gpu = _cuda_index(device)
        self.torch = torch
        self.device = torch.device("cpu" if gpu is None else f"cuda:{gpu}")
        self.module = torch.jit.load(str(spec.file("torchscript")), map_location=self.device).eval()
        self.input_names = list(spec.config["feeds"])
        self.output_names = list(spec.config["outputs"])
        self.description = f"torch {torch.__version__} {self.device}"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            args = [torch.from_numpy(np.ascontiguousarray(feeds[n])).to(self.device)
                    for n in self.input_names]
            result = self.module(*args)
        if isinstance(result, torch.Tensor):
            result = (result,)
        return {name: t.float().cpu().numpy() for name, t in zip(self.output_names, result)}


BACKENDS = {"onnx": OnnxBackend, "torch": TorchBackend}


def load(spec, backend: str, device: str, threads: int = 0, spinning: bool = True):
    if device == "auto":  # the worker resolves auto first (worker/device.py); others get the first GPU
        from worker.device import cuda_devices

        device = (cuda_devices(backend) or ["cpu"])[0]
    model = BACKENDS[backend](spec, device, threads, spinning)
    log.info("loaded %s with %s", spec.name, model.description)
    return model
