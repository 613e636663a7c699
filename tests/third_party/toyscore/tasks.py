"""VectorScore: JSON lists of numbers in, {"scores", "label"} out.

model.json (written by `funnel add`): "dim" (the vector's length), "labels" (a
file, one class name per line), and a graph taking "vectors" [n, dim] float32
and giving "scores" [n, classes].
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks import Inputs, Task


class VectorScore(Task):
    input_kind = "json"
    default_limits = {"max_abs": 1_000_000}  # larger numbers are refused, not scored

    @property
    def dim(self) -> int:
        return int(self.spec.config["dim"])

    # -- web side ------------------------------------------------------------

    def preprocess(self, item: Any) -> Inputs:
        if not isinstance(item, list) or len(item) != self.dim:
            raise BadInput(f"each input is a list of {self.dim} numbers", code="bad_vector")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in item):
            raise BadInput("every element must be a finite number", code="bad_vector")
        if any(abs(x) > self.limits["max_abs"] for x in item):
            raise BadInput(f"elements lie within ±{self.limits['max_abs']}", code="bad_vector")
        return {"vector": np.asarray(item, dtype=np.float32)}

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
        scores = row["scores"]
        return {"scores": [float(s) for s in scores], "label": self.labels[int(np.argmax(scores))]}


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
