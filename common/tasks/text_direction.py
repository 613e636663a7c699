"""Text direction: a cropped text line in, whether it reads upside down out.

PP-OCR's direction classifier as rapidocr-onnxruntime ships it, run as its
TextClassifier runs it: each line scaled to 48 pixels high (at most 192 wide,
keeping its aspect ratio), normalised and padded to 192, then the likelier of
its two labels ("0", "180") with its probability. RapidOCR turns a line
whose label is "180" with a probability above its `cls_thresh` before it
reads it; `upside_down` says so. Items are uint8 BGR lines of any size.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks.base import Context, Inputs, Task
from funnel.common.tasks.text_detection import bgr_pixels, rapidocr_config


class TextDirection(Task):
    """model.json: "feeds" (the graph's input)."""

    input_kind = "image"
    default_limits = {"max_pixels": 4_000_000}

    def preprocess(self, item: bytes) -> Inputs:
        return {"line": bgr_pixels(item, self.limits["max_pixels"])}

    def output_shapes(self) -> dict[str, list[int]]:
        return {"probabilities": [2]}

    # -- worker side ---------------------------------------------------------

    def check(self, inputs: Inputs) -> None:
        line = inputs.get("line")
        if line is None or line.dtype != np.uint8 or line.ndim != 3 or line.shape[2] != 3 \
                or min(line.shape[:2]) < 1:
            raise BadInput("expected a uint8 BGR line of shape (height, width, 3)", code="bad_input")

    @functools.cached_property
    def _classifier(self):
        from rapidocr_onnxruntime.ch_ppocr_cls import TextClassifier

        classifier = object.__new__(TextClassifier)  # its resize and labels, without its model session
        config = rapidocr_config("Cls")
        classifier.cls_image_shape, classifier.cls_thresh = config["cls_image_shape"], config["cls_thresh"]
        classifier.labels = config["label_list"]
        return classifier

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        (feed,) = self.spec.config.get("feeds", ["x"])
        return {feed: np.stack([self._classifier.resize_norm_img(item["line"]) for item in items])}

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        (probabilities,) = row.values()
        best = int(np.argmax(probabilities))  # as the package's ClsPostProcess picks
        label, score = self._classifier.labels[best], float(probabilities[best])
        return {"label": label, "score": score,
                "upside_down": "180" in label and score > self._classifier.cls_thresh}
