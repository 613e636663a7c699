"""OCR as RapidOCR() runs it, as a chain of three served models (common/tasks/base.py, `Chain`).

    text-detector  →  text-direction (each line)  →  text-recognizer (each line)

Between the steps, in the chain's worker, the package's own geometry: the page
scaled within RapidOCR's side limits and letterboxed where it is too flat
(its preprocess and maybe_add_letterbox), the boxes sorted top to bottom
(sorted_boxes) and each line cut out straight (get_rotate_crop_image), a line
the direction model finds upside down turned (cls_thresh), then each scaled to
the recogniser's height as its TextRecognizer scales it. The boxes go back to
the page's own pixels (_get_origin_points) and the lines read below its
`text_score` are dropped. Each line's recognition batches with every other
request's lines.

TextRecognizer pads each of its batches of six (lines sorted by aspect ratio)
to the widest's width, and the padding changes what the model reads: each line
goes to the recogniser with the width its batch of six would pad it to
(`pad_to`), and runs with the lines padded as wide, whichever request theirs.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from funnel.common.tasks.base import Chain, Context, Inputs, StepFailed, WithContext
from funnel.common.tasks.text_detection import bgr_pixels, rapidocr_config

DETECT, DIRECTION, RECOGNIZE = 0, 1, 2


class OCR(Chain):
    """model.json: "steps", the three models in the order above."""

    input_kind = "image"
    default_limits = {"max_pixels": 40_000_000}

    def preprocess(self, item: bytes) -> Inputs:
        return {"image": bgr_pixels(item, self.limits["max_pixels"])}

    def output_shapes(self) -> dict[str, list[int]]:
        return {"lines": [-1]}

    # -- the chain's worker --------------------------------------------------

    @functools.cached_property
    def _ocr(self):
        from rapidocr_onnxruntime import RapidOCR

        config = rapidocr_config("Global")
        ocr = object.__new__(RapidOCR)  # its methods and settings, without the sessions it would open
        for name in ("text_score", "min_height", "width_height_ratio", "max_side_len", "min_side_len"):
            setattr(ocr, name, config[name])
        return ocr

    def page(self, item: Inputs) -> tuple[np.ndarray, dict[str, Any]]:
        """The page the detector reads, and RapidOCR's record of how it was scaled and padded."""
        image, ratio_h, ratio_w = self._ocr.preprocess(item["image"])
        image, record = self._ocr.maybe_add_letterbox(image, {"preprocess": {"ratio_h": ratio_h, "ratio_w": ratio_w}})
        return image, record

    def boxes(self, done: list[list[Any]]) -> list[np.ndarray]:
        (found,) = done[DETECT]
        if isinstance(found, StepFailed):
            raise found
        if not found["boxes"]:
            return []
        return self._ocr.sorted_boxes(np.asarray(found["boxes"], dtype=np.float32))

    def lines(self, item: Inputs, done: list[list[Any]]) -> list[np.ndarray]:
        """Each box's line cut out of the page, turned where the direction model found it upside down."""
        import cv2

        crops = self._ocr.get_crop_img_list(self.page(item)[0], self.boxes(done))
        if len(done) > DIRECTION:
            crops = [cv2.rotate(crop, 1) if isinstance(way, dict) and way["upside_down"] else crop
                     for crop, way in zip(crops, done[DIRECTION])]
        return crops

    def next_items(self, step: int, item: Inputs, context: Context | None, done: list[list[Any]]) -> list:
        if step == DETECT:
            page = self.page(item)[0]
            return [WithContext({"image": page}, {"height": page.shape[0], "width": page.shape[1]})]
        crops = self.lines(item, done)
        if step == DIRECTION:
            return [{"line": np.ascontiguousarray(crop)} for crop in crops]
        return [{"pixels": np.ascontiguousarray(line[:, :, ::-1]), "pad_to": np.int32(pad_to)}
                for line, pad_to in recognizer_lines(crops)]

    def answer(self, item: Inputs, context: Context | None, done: list[list[Any]]) -> dict[str, Any]:
        boxes = self.boxes(done)
        if not boxes:
            return {"lines": []}
        height, width = item["image"].shape[:2]
        placed = self._ocr._get_origin_points(boxes, self.page(item)[1], height, width)
        lines = []
        for box, read in zip(placed, done[RECOGNIZE]):
            if isinstance(read, StepFailed):
                lines.append({"box": box.tolist(), "error": read.public()})
            elif read["confidence"] >= self._ocr.text_score:
                lines.append({"box": box.tolist(), "text": read["text"], "confidence": read["confidence"]})
        return {"lines": lines}


def recognizer_lines(crops: list[np.ndarray]) -> list[tuple[np.ndarray, int]]:
    """Each line scaled to the recogniser's height as TextRecognizer scales it, and the width it pads
    it to: its batches of rec_batch_num lines, sorted by aspect ratio, each padded to int(48 × the
    batch's widest ratio, at least the model's own), each line ceil(48 × its ratio) wide within that."""
    import cv2

    config = rapidocr_config("Rec")
    _, height, width = config["rec_img_shape"]
    ratios = [crop.shape[1] / float(crop.shape[0]) for crop in crops]
    order = np.argsort(np.array(ratios))
    scaled: list[tuple[np.ndarray, int]] = [(np.empty(0), 0)] * len(crops)
    for start in range(0, len(crops), config["rec_batch_num"]):
        group = order[start:start + config["rec_batch_num"]]
        cap = int(height * max(width / height, *(ratios[i] for i in group)))
        for i in group:
            scaled[i] = cv2.resize(crops[i], (min(cap, int(math.ceil(height * ratios[i]))), height)), cap
    return scaled


