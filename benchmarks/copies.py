"""Copies of a model, each with weights of its own, and the answers each must give (benchmarks.multiplex).

The toy scorer's copies are made with another seed's weights (tests/toy_model.py), as an ONNX graph or a
TorchScript module. A model of a store is copied from its TorchScript export: the copy's i-th has one
weight tensor, the last floating-point constant the frozen graph consumes (for a transformer, its last
LayerNorm's weight; for a classifier, its last layer's), multiplied elementwise by 1 + SPREAD·N(0, 1)
drawn from seed i, and the rest of the model's files (its tokenizer, labels) as they are. Its expected
answers are computed in this process, the probes as one batch, by the backend the workers use on the same
device; an answer is right when it lies within the tolerance of its own model's and nearer to it than to
any other copy's (fp16 answers move with a batch's padding and size, so a tolerance alone would be loose).
"""

from __future__ import annotations

import gc
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from funnel.common import tasks
from funnel.common.store import ModelSpec, load_spec, write_model
from tests import toy_model

TOY = "toy"
SPREAD = 0.3  # copies' answers lie ~0.3 apart (L2, unit embeddings); fp16's batch-to-batch drift ~0.003
# Largest difference (any element) an answer may have from its own model's, by the weights' precision.
ATOL = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
         "A man is riding a horse on a sunny day in the hills.", "Two dogs play in the snow.",
         "The stock market fell sharply on Monday after the announcement.", "Where is the nearest station?",
         "A woman slices tomatoes in a small kitchen while the radio plays an old song.",
         "Quantum computers use qubits.", "He forgot his umbrella again.",
         "The committee will publish its findings next spring, after the review of every submission.",
         "Cats sleep most of the day.", "Please close the door.", "The river flooded the lower fields.",
         "An old bridge crosses the valley.", "She won the chess tournament in the final round."]


@dataclass
class Probes:
    """The fixed requests the load sends, and each copy's expected answer to each."""

    bodies: list[dict[str, Any]]  # one JSON request body per probe
    fields: list[str]  # the answer's numeric fields, compared in this order
    expected: np.ndarray  # [probe, copy, values]
    atol: float

    def right(self, copy: int, probe: int, answer: dict[str, Any]) -> bool:
        """Whether the answer is its own copy's: within atol of it, and nearer to it than to any other."""
        try:
            got = np.concatenate([np.ravel(np.asarray(answer[f], np.float32)) for f in self.fields])
        except (KeyError, TypeError, ValueError):
            return False
        expected = self.expected[probe]
        if got.shape != expected.shape[1:]:
            return False
        distance = np.abs(expected - got).max(axis=1)
        return bool(distance[copy] <= self.atol and distance.argmin() == copy)


def names(base: str, count: int) -> list[str]:
    return [f"{'scorer' if base == TOY else base}-{i:02d}" for i in range(count)]


def toy_copies(store: Path, work: Path, count: int, backend: str, batch_size: int) -> Probes:
    """count copies of the toy scorer in store, the i-th with the i-th seed's weights."""
    for i, name in enumerate(names(TOY, count)):
        done = toy_model.add_toy(store, work, name, "toyscore.tasks:VectorScore", "--batch-size", str(batch_size),
                                 seed=i, backend=backend)
        if done.returncode != 0:
            raise SystemExit(f"funnel add failed: {done.stderr}")
    vectors = toy_model.vectors(64, seed=21)
    expected = np.stack([toy_model.expected_scores(np.array(vectors, np.float32), seed=i) for i in range(count)],
                        axis=1)
    return Probes([{"input": v} for v in vectors], ["scores"], expected, 1e-5)


def model_copies(source: Path, base: str, store: Path, count: int, device: str) -> Probes:
    """count copies of the store's model `base` (its TorchScript export) in store, each with one weight
    tensor of its own, and each copy's answers to the probes, computed here on `device`."""
    import torch

    spec = load_spec(source, base)
    if "torchscript" not in spec.config:
        raise SystemExit(f"{base} has no TorchScript export in {source}")
    task = tasks.load(spec)
    if task.input_kind != "text":
        raise SystemExit(f"{base} takes {task.input_kind}: copies of a model are probed with texts only")
    items = [task.preprocess(text) for text in TEXTS]
    module = torch.jit.load(str(spec.file("torchscript")), map_location="cpu")
    node, index = last_weight(module.graph)
    weight = node.inputsAt(index).toIValue()
    answers = []
    for i, name in enumerate(names(base, count)):
        noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float32)
        swap_constant(module.graph, node, index, (weight.float() * (1 + SPREAD * noise)).to(weight.dtype))
        write_model(store, name, lambda folder, i=i: copy_files(spec, module, folder, i))
        answers.append(answers_of(load_spec(store, name), items, device))
    fields = sorted(answers[0])
    expected = np.stack([np.concatenate([answer[f] for f in fields], axis=1) for answer in answers], axis=1)
    dtype = str(weight.dtype).removeprefix("torch.")
    return Probes([{"text": text} for text in TEXTS], fields, expected, ATOL.get(dtype, ATOL["float16"]))


def swap_constant(graph, node, index: int, tensor) -> None:
    """Make node's index-th input a new constant holding tensor (the old one goes if nothing else uses it)."""
    old = node.inputsAt(index).node()
    new = graph.insertConstant(tensor)
    new.node().moveBefore(node)
    node.replaceInput(index, new)
    if not old.output().uses():
        old.destroy()


def copy_files(spec: ModelSpec, module, folder: Path, copy: int) -> dict[str, Any]:
    """A copy's folder: the module as model.pt, the model's other files (tokenizer, labels) as they are;
    its model.json the model's, TorchScript only."""
    import torch

    torch.jit.save(module, str(folder / "model.pt"))
    config = {k: v for k, v in spec.config.items() if k not in ("onnx", "name")}
    for value in config.values():
        if isinstance(value, str) and value != spec.config["torchscript"] and (spec.path / value).is_file():
            shutil.copy(spec.path / value, folder / value)
    config.update(torchscript="model.pt", description=f"{spec.config.get('description', spec.name)}, copy {copy}")
    return config


def last_weight(graph) -> tuple[Any, int]:
    """The last node of the graph that takes a floating-point tensor constant of several elements, and
    which of its inputs that constant is."""
    found = None
    for node in graph.nodes():
        for index, value in enumerate(node.inputs()):
            const = value.node()
            if const.kind() != "prim::Constant" or value.type().kind() != "TensorType":
                continue
            tensor = value.toIValue()
            if tensor is not None and tensor.is_floating_point() and tensor.numel() > 1:
                found = (node, index)
                break
    if found is None:
        raise SystemExit("no weight tensor found in the TorchScript graph (is it frozen?)")
    return found


def answers_of(spec: ModelSpec, items: list, device: str) -> dict[str, np.ndarray]:
    """The model's answers to the items, run as one batch (one input shape), as a worker on `device`
    runs them: each numeric field of the answers, [item, values]."""
    from funnel.worker import backend as backends

    task = tasks.load(spec)
    model = backends.load(spec, "torch", device)
    rows = [task.postprocess(row) for row in model.run(task.collate(items))]
    del model
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    return {k: np.stack([np.ravel(np.asarray(row[k], np.float32)) for row in rows])
            for k, v in rows[0].items() if isinstance(v, np.ndarray)}


def describe(base: str, backend: str) -> str:
    if base == TOY:
        return f"the toy scorer ({'TorchScript' if backend == 'torch' else 'ONNX'})"
    return f"{base} (TorchScript)"

