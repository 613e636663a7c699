"""The toy models of tests/third_party/toyscore: their ONNX graphs, expected answers, and `funnel add` for them.

The scorer is used by the your-own-model test, and in its PacedScore variant (a
run that takes a known time, whatever the CPU does) by the load-shedding test,
the batching test (a batch's fixed cost the adaptive linger learns) and the
worker-crash tests (a worker that holds its batch long enough to be killed
mid-batch). The scaler (ScaledList, ScaledByWidth: a variable-length output) by
the ragged-outputs test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

PACKAGE_DIR = Path(__file__).resolve().parent / "third_party"
LABELS = ["low", "middle", "high"]
WEIGHTS = np.random.default_rng(7).normal(size=(4, 3)).astype(np.float32)
BIAS = np.array([0.1, -0.2, 0.05], np.float32)


def weights(seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The scorer's W and b: the toy's own, or (a seed) another copy's, whose answers differ."""
    if seed is None:
        return WEIGHTS, BIAS
    rng = np.random.default_rng(1000 + seed)
    return rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)


def expected_scores(vectors: np.ndarray, seed: int | None = None) -> np.ndarray:
    w, b = weights(seed)
    logits = vectors.astype(np.float32) @ w + b
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def write_graph(path: Path, seed: int | None = None) -> None:
    """scores = softmax(vectors @ W + b), with a dynamic batch axis (seed: another copy's W and b)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w, b = weights(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["vectors", "W"], ["product"]),
         helper.make_node("Add", ["product", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["scores"], axis=1)],
        "toy-score",
        [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_torchscript(path: Path, seed: int | None = None) -> None:
    """The same scorer as a TorchScript module (for --backend torch): the graph's W and b as buffers."""
    import torch

    class Score(torch.nn.Module):
        def __init__(self, w: torch.Tensor, b: torch.Tensor):
            super().__init__()
            self.register_buffer("w", w)
            self.register_buffer("b", b)

        def forward(self, vectors: torch.Tensor) -> torch.Tensor:
            return torch.softmax(vectors @ self.w + self.b, dim=1)

    w, b = weights(seed)
    torch.jit.save(torch.jit.script(Score(torch.from_numpy(w), torch.from_numpy(b)).eval()), str(path))


SCALE = 2.0


def write_scale_graph(path: Path) -> None:
    """scaled = values * SCALE, with dynamic batch and width axes: a row as wide as its run's input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["values", "scale"], ["scaled"])],
        "toy-scale",
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("scaled", TensorProto.FLOAT, ["batch", "width"])],
        [numpy_helper.from_array(np.array(SCALE, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def outside_env() -> dict:
    """The environment of a user whose package is importable: only PYTHONPATH names it."""
    return {**os.environ, "PYTHONPATH": str(PACKAGE_DIR)}


def outside_stack(store: Path):
    """A stack of the store whose web tier and workers import the outside packages (PYTHONPATH names them)."""
    from funnel.scripts.stack import Stack

    env = {"PYTHONPATH": str(PACKAGE_DIR)}
    return Stack(model_store=store, web_env=env, worker_env=env)


def funnel(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "funnel"), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def add_toy(store: Path, work: Path, name: str, task: str = "toyscore.tasks:VectorScore",
            *extra: str, seed: int | None = None, backend: str = "onnx") -> subprocess.CompletedProcess:
    """`funnel add` the toy scorer to store as `name` (extra: more of add's flags; seed: a copy whose
    weights, and answers, differ; backend torch: its TorchScript export alone, no ONNX graph)."""
    if backend == "torch":
        write_torchscript(work / "toy.pt", seed)
        graph = ["--torchscript", str(work / "toy.pt"), "--feeds", "vectors", "--outputs", "scores"]
    else:
        write_graph(work / "toy.onnx", seed)
        graph = ["--onnx", str(work / "toy.onnx")]
    (work / "classes.txt").write_text("\n".join(LABELS) + "\n")
    return funnel("add", name, "--store", str(store), "--task", task, *graph,
                  "--file", f"labels={work / 'classes.txt'}", "--set", "dim=4", *extra, env=outside_env())


def add_python(store: Path, work: Path, name: str, *extra: str) -> None:
    """`funnel add` the PythonScore variant: the scorer run in Python, its W and b in an .npz, no graph."""
    w, b = weights()
    np.savez(work / "toy-weights.npz", w=w, b=b)
    (work / "classes.txt").write_text("\n".join(LABELS) + "\n")
    done = funnel("add", name, "--store", str(store), "--task", "toyscore.tasks:PythonScore",
                  "--file", f"weights={work / 'toy-weights.npz'}", "--file", f"labels={work / 'classes.txt'}",
                  "--set", "dim=4", "--outputs", "scores", *extra, env=outside_env())
    assert done.returncode == 0, done.stderr


def add_paced(store: Path, work: Path, name: str, batch_s: float, item_s: float = 0.0,
              batch_size: int = 8) -> None:
    """`funnel add` the PacedScore variant: each batch takes batch_s + item_s per item, on any machine."""
    done = add_toy(store, work, name, "toyscore.tasks:PacedScore", "--set", f"pace_batch_s={batch_s!r}",
                   "--set", f"pace_item_s={item_s!r}", "--batch-size", str(batch_size))
    assert done.returncode == 0, done.stderr


def add_scaled(store: Path, work: Path, name: str, task: str = "toyscore.tasks:ScaledList",
               batch_size: int = 4, *extra: str) -> None:
    """`funnel add` a variable-length output: ScaledList (a row as wide as its batch's widest input) or
    ScaledByWidth (as wide as its own, by buckets)."""
    write_scale_graph(work / "scale.onnx")
    done = funnel("add", name, "--store", str(store), "--task", task, "--onnx", str(work / "scale.onnx"),
                  "--batch-size", str(batch_size), *extra, env=outside_env())
    assert done.returncode == 0, done.stderr


def vectors(n: int, seed: int = 0) -> list[list[float]]:
    """n distinct inputs for the toy scorer, exact in float32 and JSON alike."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-4096, 4096, size=(n, 4)) / 1024).tolist()
