"""Funnel's task for the detector: the letterbox in the web tier, the boxes in the worker.

model.json (written by `funnel add`): "size" (the square the graph takes),
"labels" (a file, one class name per line), and a graph taking "images" uint8
[n, size, size, 3] and giving "output0" [n, 4 + classes, anchors]. The
letterbox's scale and padding, and the image's size, are the item's context:
preprocess learns them, postprocess undoes the letterbox with them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from funnel import BadInput, Context, Inputs, Task, WithContext, imaging
from toydetect.detect import boxes, letterbox


class Detector(Task):
    input_kind = "image"
    default_limits = {"max_pixels": 4_000_000}

    @property
    def size(self) -> int:
        return int(self.spec.config["size"])

    @functools.cached_property
    def labels(self) -> list[str]:
        return self.spec.file("labels").read_text().split()

    def load_files(self) -> None:
        _ = self.labels

    def preprocess(self, item: bytes) -> WithContext:
        image = imaging.decode(item, max_pixels=self.limits["max_pixels"])
        pixels, scale, pad = letterbox(image, self.size)
        return WithContext({"pixels": pixels}, {"scale": scale, "pad": list(pad),
                                                "size": [image.width, image.height]})

    def public(self) -> dict[str, Any]:
        return {"size": self.size, "labels": self.labels}

    def check(self, inputs: Inputs) -> None:
        pixels = inputs.get("pixels")
        if pixels is None or pixels.dtype != np.uint8 or pixels.shape != (self.size, self.size, 3):
            raise BadInput(f"expected uint8 of shape ({self.size}, {self.size}, 3)", code="bad_input")

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        return {"images": np.stack([item["pixels"] for item in items])}

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        if context is None:
            raise ValueError("the detector answers boxes in the image's pixels: it needs the item's context")
        return {"detections": boxes(row["output0"], context["scale"], context["pad"], context["size"], self.labels)}
