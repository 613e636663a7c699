"""The detector's own code, as its package would ship it, with or without Funnel.

A YOLOv8-style graph takes letterboxed images, uint8 [n, size, size, 3], and
gives `output0` [n, 4 + classes, anchors]: each anchor's box centre, width and
height in the letterboxed square's pixels, then its class scores. `detect`
runs one image through a session and answers boxes in the original image's
pixels; Funnel's task (toydetect.tasks) splits the same steps around the model.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

PAD = 114  # the letterbox's grey, as YOLOv8's


def letterbox(image: Image.Image, size: int) -> tuple[np.ndarray, float, tuple[int, int]]:
    """The image scaled to fit a size x size square, centred on grey: its pixels, the scale, the padding (x, y)."""
    scale = min(size / image.width, size / image.height)
    width, height = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    pad = ((size - width) // 2, (size - height) // 2)
    square = Image.new("RGB", (size, size), (PAD, PAD, PAD))
    square.paste(image.resize((width, height), Image.Resampling.BILINEAR), pad)
    return np.asarray(square, dtype=np.uint8), scale, pad


def boxes(output: np.ndarray, scale: float, pad: tuple[int, int] | list[int], size: tuple[int, int] | list[int],
          labels: list[str], threshold: float = 0.5, iou: float = 0.5) -> list[dict[str, Any]]:
    """One image's `output0` [4 + classes, anchors] -> its detections, best first, each box
    [x1, y1, x2, y2] in the original image's pixels (the letterbox undone, clipped to the image)."""
    anchors = output.T.astype(np.float64)
    scores = anchors[:, 4:]
    classes, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best > threshold)
    keep = keep[np.argsort(-best[keep], kind="stable")]
    cx, cy, w, h = anchors[keep, :4].T
    corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    chosen: list[int] = []
    for i in range(len(keep)):  # greedy non-maximum suppression, per class
        if all(classes[keep[j]] != classes[keep[i]] or overlap(corners[i], corners[j]) <= iou for j in chosen):
            chosen.append(i)
    width, height = size
    found = []
    for i in chosen:
        x1, y1, x2, y2 = corners[i]
        box = [(x1 - pad[0]) / scale, (y1 - pad[1]) / scale, (x2 - pad[0]) / scale, (y2 - pad[1]) / scale]
        box = [min(max(v, 0.0), float(limit)) for v, limit in zip(box, (width, height, width, height))]
        found.append({"box": [round(float(v), 2) for v in box], "score": round(float(best[keep[i]]), 5),
                      "label": labels[int(classes[keep[i]])]})
    return found


def overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two [x1, y1, x2, y2] boxes."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return float(w * h / union) if union > 0 else 0.0


def detect(session: Any, data: bytes, size: int, labels: list[str]) -> list[dict[str, Any]]:
    """The detections of one encoded image, with an onnxruntime session of the graph: no Funnel involved."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    pixels, scale, pad = letterbox(image, size)
    (output,) = session.run(["output0"], {"images": pixels[None]})
    return boxes(output[0], scale, pad, (image.width, image.height), labels)
