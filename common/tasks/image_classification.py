"""Image classification: uint8 pixels in, top-k {label, index, probability} out."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks.base import Context, Inputs, Task
from funnel.common.tasks.imaging import center_crop


class ImageClassification(Task):
    """model.json: "preprocess": {"resize", "crop"}, "labels" (a file, one label per line), "top_k"."""

    input_kind = "image"
    default_limits = {"max_pixels": 40_000_000}  # decompression-bomb guard

    # -- web side ------------------------------------------------------------

    def load_files(self) -> None:
        _ = self.labels  # /v2's classification names the classes

    def preprocess(self, item: bytes) -> Inputs:
        shape = self.spec.config["preprocess"]
        return {"pixels": center_crop(item, shape["resize"], shape["crop"], self.limits["max_pixels"])}

    def public(self) -> dict[str, Any]:
        return {"preprocess": self.spec.config["preprocess"], "top_k": self.top_k}

    def output_shapes(self) -> dict[str, list[int]]:
        return {"probabilities": [len(self.labels)]}

    def class_labels(self) -> tuple[str, ...]:
        return self.labels

    # -- worker side ---------------------------------------------------------

    @property
    def top_k(self) -> int:
        return int(self.spec.config.get("top_k", 5))

    def check(self, inputs: Inputs) -> None:
        pixels = inputs.get("pixels")
        crop = self.spec.config["preprocess"]["crop"]
        if pixels is None or pixels.dtype != np.uint8 or pixels.shape != (crop, crop, 3):
            raise BadInput(f"expected uint8 pixels of shape ({crop}, {crop}, 3)", code="bad_input")

    def warmup_inputs(self) -> list[Inputs]:
        crop = self.spec.config["preprocess"]["crop"]
        return [{"pixels": np.zeros((crop, crop, 3), dtype=np.uint8)}]

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        return {"pixels": np.stack([item["pixels"] for item in items])}

    @functools.cached_property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.spec.file("labels").read_text().splitlines())

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        probabilities = row["probabilities"]
        top = np.argsort(-probabilities)[: self.top_k]
        return {"predictions": [
            {"label": self.labels[i], "index": int(i), "probability": float(probabilities[i])}
            for i in top
        ]}
