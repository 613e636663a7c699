"""Text-line recognition (CTC): an image of one line of text in, its text and confidence out.

A line is any width: the web tier scales it to the model's height, keeping its
aspect ratio, so each item is a uint8 array [height, width, 3] of its own
width. The worker pads a run to its widest line (at least `min_width`, the
width the model was trained at), runs each width group apart (`buckets`), and
decodes each row greedily: the best character per column, repeats merged,
blanks dropped. The model's rows are as wide as its run (a column per 8
pixels), so the /v2 outputs `indices` and `scores` vary in length from item
to item.

Preprocessing, padding and decoding follow PaddleOCR's recogniser as
rapidocr-onnxruntime runs it (BGR order, pixels scaled to [-1, 1], zero
padding on the right), so a line at the model's height reads the same here as
there (tests/integration/test_text_recognizer.py). A line may name the width it is
padded to (`pad_to`, at least its own): the OCR chain (common/tasks/ocr.py) pads
each line as wide as TextRecognizer pads the batch of six it would be read in,
since the padding changes what the model reads.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks.base import Context, Inputs, Task
from funnel.common.tasks.buckets import group_by_width
from funnel.common.tasks.imaging import decode

# What one more model call costs, in padded pixel columns (model.json's "run_cost_columns" overrides it):
# measured on the CPU in docs/models.md, "Variable-width inputs".
RUN_COST_COLUMNS = 64


class TextRecognition(Task):
    """model.json: "characters" (a file, one character per line: the model's classes after the blank,
    its last class a space), "height", "min_width"."""

    input_kind = "image"
    # A line may be far wider than tall, but a guard on the aspect ratio still bounds the columns.
    default_limits = {"max_pixels": 40_000_000, "max_aspect": 25}

    @property
    def height(self) -> int:
        return int(self.spec.config["height"])

    @property
    def max_width(self) -> int:
        return self.height * self.limits["max_aspect"]

    # -- web side ------------------------------------------------------------

    def load_files(self) -> None:
        _ = self.characters  # GET /v1/models counts them

    def preprocess(self, item: bytes) -> Inputs:
        from PIL import Image

        image = decode(item, max_pixels=self.limits["max_pixels"], max_aspect=self.limits["max_aspect"],
                       min_side=self.height)
        w, h = image.size
        width = min(self.max_width, math.ceil(self.height * w / h))
        line = image.resize((width, self.height), Image.Resampling.BILINEAR)
        return {"pixels": np.asarray(line, dtype=np.uint8)}

    def public(self) -> dict[str, Any]:
        return {"height": self.height, "max_width": self.max_width, "characters": len(self.characters) - 2}

    def output_shapes(self) -> dict[str, list[int]]:
        return {"indices": [-1], "scores": [-1]}

    # -- worker side ---------------------------------------------------------

    def check(self, inputs: Inputs) -> None:
        pixels = inputs.get("pixels")
        if pixels is None or pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[0] != self.height \
                or pixels.shape[2] != 3 or not 0 < pixels.shape[1] <= self.max_width:
            raise BadInput(f"expected uint8 pixels of shape ({self.height}, 1 to {self.max_width}, 3)",
                           code="bad_input")
        pad_to = inputs.get("pad_to")
        if pad_to is None:
            return
        if pad_to.shape != () or pad_to.dtype.kind not in "iu" or not pixels.shape[1] <= int(pad_to) <= self.max_width:
            raise BadInput(f"pad_to is one integer from the line's width to {self.max_width}", code="bad_input")

    def buckets(self, items: list[Inputs]) -> list[list[int]]:
        """Runs of lines of like width: one long line among short ones would pad them all to its width.
        Lines that name the width they are padded to (`pad_to`) run with the lines padded as wide."""
        padded: dict[int, list[int]] = {}
        free = []
        for i, item in enumerate(items):
            if "pad_to" in item:
                padded.setdefault(max(self.min_width, int(item["pad_to"])), []).append(i)
            else:
                free.append(i)
        widths = [max(self.min_width, items[i]["pixels"].shape[1]) for i in free]
        runs = group_by_width(widths, float(self.spec.config.get("run_cost_columns", RUN_COST_COLUMNS))) if free else []
        return [[free[i] for i in run] for run in runs] + list(padded.values())

    @property
    def min_width(self) -> int:
        return int(self.spec.config.get("min_width", 0))

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        """BGR, scaled to [-1, 1], padded with zeros on the right to the widest line (at least min_width)."""
        width = max(self.min_width, *(int(item["pad_to"]) if "pad_to" in item else item["pixels"].shape[1]
                                      for item in items))
        batch = np.zeros((len(items), 3, self.height, width), dtype=np.float32)
        for row, item in enumerate(items):
            pixels = item["pixels"][:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / 255
            pixels -= 0.5
            pixels /= 0.5
            batch[row, :, :, :pixels.shape[2]] = pixels
        (feed,) = self.spec.config.get("feeds", ["x"])
        return {feed: batch}

    @functools.cached_property
    def characters(self) -> tuple[str, ...]:
        """The model's classes: the blank, the file's characters, and a space."""
        listed = self.spec.file("characters").read_text(encoding="utf-8").split("\n")[:-1]
        return ("", *listed, " ")

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        indices, scores = row["indices"], row["scores"]
        kept = indices != 0
        kept[1:] &= indices[1:] != indices[:-1]
        text = "".join(self.characters[i] for i in indices[kept])
        return {"text": text, "confidence": float(scores[kept].mean(dtype=np.float64)) if kept.any() else 0.0}
