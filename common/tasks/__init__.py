"""Task modules: what turns a request into tensors and a model output into a result.

Each task module provides
  web side (numpy only, never torch or onnxruntime):
    parse(request, limits) -> (items, single)   raw items from an HTTP request
    preprocess(item, spec, limits) -> inputs    named numpy arrays for one job
  worker side:
    check(inputs, spec)                         raise BadInput for a malformed job
    collate(list of inputs, spec) -> feeds      one batch for the backend
    postprocess(row, spec) -> outputs           one item's named outputs

A new model of an existing task is only a model store folder; a new task is
one more module here, registered in TASKS.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from common.tasks import image_classification, text_embedding


@dataclass(frozen=True)
class Limits:
    """Per-request input limits the web tier enforces."""

    max_items: int = 64
    max_text_chars: int = 20_000
    max_image_pixels: int = 40_000_000


TASKS: dict[str, ModuleType] = {
    "image_classification": image_classification,
    "text_embedding": text_embedding,
}


def get(task: str) -> ModuleType:
    try:
        return TASKS[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}") from None
