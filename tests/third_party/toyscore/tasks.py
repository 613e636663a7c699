"""Toy tasks of a package outside Funnel.

VectorScore: JSON lists of numbers in, {"scores", "label"} out. model.json
(written by `funnel add`): "dim" (the vector's length), "labels" (a file, one
class name per line), and a graph taking "vectors" [n, dim] float32 and giving
"scores" [n, classes]. PacedScore: the same at a fixed speed; SlowLoadScore: the
same, slow to load. PythonScore: the same in Python (load and predict, no graph),
with inputs that make its predict fail, hang or crash, for the fault tests.

ScaledList and ScaledByWidth: a variable-length output. JSON lists of 1 to
max_len numbers in, each number times the graph's constant out; the graph takes
"values" [n, width] and gives "scaled" [n, width], so an item's row is as wide as
its run's widest list (ScaledByWidth runs every width apart: as wide as its own).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks import Chain, Inputs, StepFailed, Task
from funnel.common.tasks.buckets import group_by_width


class VectorScore(Task):
    input_kind = "json"
    default_limits = {"max_abs": 1_000_000}  # larger numbers are refused, not scored

    @property
    def dim(self) -> int:
        return int(self.spec.config["dim"])

    # -- web side ------------------------------------------------------------

    def preprocess(self, item: Any) -> Inputs:
        if type(item) is not list or len(item) != self.dim:
            raise BadInput(f"each input is a list of {self.dim} numbers", code="bad_vector")
        bound = self.limits["max_abs"]
        for x in item:  # one pass for the usual vector; a refused one is told why below
            if type(x) not in (int, float) or not -bound <= x <= bound:  # a bool's type is bool; NaN fails
                self._refuse(item)
        return {"vector": np.array(item, dtype=np.float32)}

    def _refuse(self, item: list) -> None:
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in item):
            raise BadInput("every element must be a finite number", code="bad_vector")
        raise BadInput(f"elements lie within ±{self.limits['max_abs']}", code="bad_vector")

    def public(self) -> dict[str, Any]:
        return {"dim": self.dim, "labels": list(self.labels)}

    # -- worker side ---------------------------------------------------------

    def check(self, inputs: Inputs) -> None:
        vector = inputs.get("vector")
        if vector is None or vector.dtype != np.float32 or vector.shape != (self.dim,):
            raise BadInput(f"expected float32 of shape ({self.dim},)", code="bad_input")

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        return {"vectors": np.stack([item["vector"] for item in items])}

    @functools.cached_property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.spec.file("labels").read_text().split())

    def postprocess(self, row: dict[str, np.ndarray]) -> dict[str, Any]:
        scores = row["scores"].tolist()  # Python floats at once, not one numpy scalar at a time
        return {"scores": scores, "label": self.labels[scores.index(max(scores))]}


class PacedScore(VectorScore):
    """VectorScore at a fixed speed, like an accelerator that the host's CPU load does not slow.

    Each batch takes model.json's pace_batch_s plus pace_item_s per item. The
    load-shedding test uses it: on a 2-core machine its own load generator
    would otherwise slow a CPU model the moment the load arrives.
    """

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        config = self.spec.config
        time.sleep(float(config["pace_batch_s"]) + float(config["pace_item_s"]) * len(items))
        return super().collate(items)


class SlowLoadScore(VectorScore):
    """VectorScore whose worker takes model.json's load_s to load it, like a large model's: a worker
    can be killed while it loads."""

    def warmup_inputs(self) -> list[Inputs]:  # the worker's alone: its load ends with the warm-up
        time.sleep(float(self.spec.config.get("load_s", 0)))
        return super().warmup_inputs()


class PythonScore(VectorScore):
    """VectorScore in Python: W and b from model.json's "weights" (an .npz), no graph.

    A vector whose first element is 666 makes predict raise BadInput (400, code refused_by_model),
    777 a ValueError (500), 999 hang, 13 kill its process; model.json's pace_batch_s and pace_item_s,
    when set, pace each call as PacedScore does.
    """

    def load(self, device: str) -> tuple[np.ndarray, np.ndarray]:
        weights = np.load(self.spec.file("weights"))
        return weights["w"], weights["b"]

    def predict(self, model: tuple[np.ndarray, np.ndarray], batch: dict[str, np.ndarray]) -> np.ndarray:
        vectors = batch["vectors"]
        first = set(vectors[:, 0].tolist())
        if 666 in first:
            raise BadInput("666 is refused by the model", code="refused_by_model")
        if 777 in first:
            raise ValueError("777 breaks the model")
        if 999 in first:
            threading.Event().wait()  # never returns
        if 13 in first:
            os._exit(3)
        config = self.spec.config
        time.sleep(float(config.get("pace_batch_s", 0)) + float(config.get("pace_item_s", 0)) * len(vectors))
        w, b = model
        logits = vectors @ w + b
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


class ScaledList(Task):
    """A list of 1 to max_len numbers in, each scaled by the graph, out: {"values": [...]}.

    `collate` pads a batch with zeros to its widest list, as a text task pads to
    its longest text: each row of the output is as wide as the widest list of the
    run it was in, a variable-length output. /v1 answers it as it comes; /v2
    stacks the rows of a request, padding those of different widths.
    """

    input_kind = "json"
    default_limits = {"max_len": 256}

    def preprocess(self, item: Any) -> Inputs:
        if not isinstance(item, list) or not 0 < len(item) <= self.limits["max_len"]:
            raise BadInput(f"each input is a list of 1 to {self.limits['max_len']} numbers", code="bad_list")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in item):
            raise BadInput("every element must be a finite number", code="bad_list")
        return {"values": np.asarray(item, dtype=np.float32)}

    def check(self, inputs: Inputs) -> None:
        values = inputs.get("values")
        if (values is None or values.dtype != np.float32 or values.ndim != 1
                or not 0 < len(values) <= self.limits["max_len"]):
            raise BadInput(f"expected float32 of shape (1 to {self.limits['max_len']},)", code="bad_input")

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        widest = max(len(item["values"]) for item in items)
        values = np.zeros((len(items), widest), dtype=np.float32)
        for row, item in zip(values, items):
            row[:len(item["values"])] = item["values"]
        return {"values": values}

    def postprocess(self, row: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"values": row["scaled"].tolist()}


class ScaledByWidth(ScaledList):
    """ScaledList whose batches run in groups of like width: `buckets()` with Funnel's group_by_width.

    model.json's "run_cost" is what one more model call costs, in padded numbers:
    0 (the default) runs every width apart, so each row comes back exactly as wide
    as its own list; a larger one merges close widths into fewer runs.
    """

    def buckets(self, items: list[Inputs]) -> list[list[int]]:
        return group_by_width([len(item["values"]) for item in items], float(self.spec.config.get("run_cost", 0)))


class EachScore(Chain):
    """A chain of one step, its model.json's: every vector of a list scored by that model, one job each (a
    fan-out), answered in order, a vector the model fails with its error in its place."""

    input_kind = "json"

    def preprocess(self, item: Any) -> Inputs:
        if type(item) is not list or not item:
            raise BadInput("each input is a non-empty list of vectors", code="bad_vector")
        return {"vectors": np.stack([self.step_task(0).preprocess(vector)["vector"] for vector in item])}

    def next_items(self, step, item, context, done):
        return [{"vector": vector} for vector in item["vectors"]]

    def answer(self, item, context, done) -> dict[str, Any]:
        return {"each": [{"error": {**score.public(), "status": score.status}} if isinstance(score, StepFailed)
                         else score for score in done[0]]}
