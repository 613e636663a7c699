"""Text detection (DB): a page in, the quadrilateral of each text line out.

PP-OCRv4's detector as rapidocr-onnxruntime ships it, run as its TextDetector
runs it: the image scaled so that its shorter side is 736 pixels (to
multiples of 32), normalised, the model's probability map binarised and its
regions unclipped into boxes (the package's own DBPostProcess, with its
configured thresholds), then ordered clockwise, clipped to the image and
the slivers dropped (its filter_tag_det_res). Each item is the page as the
web tier decoded it, BGR as OpenCV would read it; pages batch with pages of
the same size, since the model's input is as large as its page.

The worker imports rapidocr_onnxruntime (and OpenCV, pyclipper, Shapely) for
the geometry; the web tier only decodes.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks.base import Context, Inputs, Task, WithContext
from funnel.common.tasks.imaging import decode


def bgr_pixels(data: bytes, max_pixels: int) -> np.ndarray:
    """An uploaded image as rapidocr's LoadImage gives it: uint8, BGR, [height, width, 3] (upright)."""
    return np.ascontiguousarray(np.asarray(decode(data, max_pixels=max_pixels), dtype=np.uint8)[:, :, ::-1])


@functools.cache
def _rapidocr_config() -> dict[str, Any]:
    from pathlib import Path

    import rapidocr_onnxruntime
    from rapidocr_onnxruntime.utils import read_yaml

    return read_yaml(str(Path(rapidocr_onnxruntime.__file__).parent / "config.yaml"))


def rapidocr_config(section: str) -> dict[str, Any]:
    """A section of the package's own config.yaml: what RapidOCR() runs with by default."""
    return _rapidocr_config()[section]


class TextDetection(Task):
    """model.json: "feeds" (the graph's input), "outputs" (its probability map)."""

    input_kind = "image"
    default_limits = {"max_pixels": 40_000_000}

    def preprocess(self, item: bytes) -> WithContext:
        page = bgr_pixels(item, self.limits["max_pixels"])
        return WithContext({"image": page}, {"height": page.shape[0], "width": page.shape[1]})

    def output_shapes(self) -> dict[str, list[int]]:
        return {"boxes": [-1, 4, 2]}

    # -- worker side ---------------------------------------------------------

    def check(self, inputs: Inputs) -> None:
        image = inputs.get("image")
        if image is None or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 \
                or min(image.shape[:2]) < 1:
            raise BadInput("expected a uint8 BGR image of shape (height, width, 3)", code="bad_input")

    def buckets(self, items: list[Inputs]) -> list[list[int]]:
        """Runs of pages of one size: the model's input is the page's own size."""
        runs: dict[tuple[int, ...], list[int]] = {}
        for i, item in enumerate(items):
            runs.setdefault(item["image"].shape, []).append(i)
        return list(runs.values())

    @functools.cached_property
    def _prepare(self):
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DetPreProcess

        config = rapidocr_config("Det")
        return DetPreProcess(config["limit_side_len"], config["limit_type"], config["mean"], config["std"])

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        (feed,) = self.spec.config.get("feeds", ["x"])
        return {feed: np.concatenate([self._prepare(item["image"]) for item in items])}

    @functools.cached_property
    def _boxes(self):
        from rapidocr_onnxruntime.ch_ppocr_det import TextDetector
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

        config = rapidocr_config("Det")
        found = DBPostProcess(**{k: config[k] for k in ("thresh", "box_thresh", "max_candidates", "unclip_ratio",
                                                         "use_dilation", "score_mode")})
        # TextDetector's own filter, without the model session its constructor would open
        return found, object.__new__(TextDetector).filter_tag_det_res

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        if context is None:
            raise BadInput("a text detection item carries its page's size (its context)", code="bad_input")
        found, keep = self._boxes
        shape = (int(context["height"]), int(context["width"]))
        (probabilities,) = row.values()
        boxes, _ = found(probabilities[None], shape)
        return {"boxes": keep(boxes, shape).tolist()}
