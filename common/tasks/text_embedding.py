"""Sentence embedding: token ids in, a mean-pooled L2-normalised vector out."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from common.errors import BadInput, UnsupportedMediaType

# -- web side ----------------------------------------------------------------


def parse(request, limits) -> tuple[list[str], bool]:
    """JSON {"text": "..."} or {"texts": ["...", ...]}."""
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(
            f'send JSON {{"text": ...}} or {{"texts": [...]}} as application/json, '
            f"not {request.mimetype or 'no content type'}")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise BadInput('body must be a JSON object {"text": ...} or {"texts": [...]}',
                       code="bad_json")
    if ("text" in body) == ("texts" in body):
        raise BadInput('give exactly one of "text" or "texts"', code="bad_json")
    single = "text" in body
    texts = [body["text"]] if single else body["texts"]
    if not isinstance(texts, list) or not texts:
        raise BadInput('"texts" must be a non-empty list of strings', code="bad_json")
    if len(texts) > limits.max_items:
        raise BadInput(f"{len(texts)} texts in one request; the limit is {limits.max_items}",
                       code="too_many_items")
    if not all(isinstance(t, str) for t in texts):
        raise BadInput("every text must be a string", code="bad_json")
    return texts, single


@functools.lru_cache(maxsize=8)
def _tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def preprocess(item: str, spec, limits) -> dict[str, np.ndarray]:
    if not item.strip():
        raise BadInput("text is empty", code="empty_input")
    if len(item) > limits.max_text_chars:
        raise BadInput(f"text has {len(item)} characters; the limit is {limits.max_text_chars}",
                       code="text_too_long")
    ids = _tokenizer(spec.file("tokenizer")).encode(item).ids
    max_tokens = spec.config["max_tokens"]
    if len(ids) > max_tokens:
        raise BadInput(f"text is {len(ids)} tokens long; this model takes at most {max_tokens}",
                       code="text_too_long")
    return {"input_ids": np.asarray(ids, dtype=np.int32)}


# -- worker side -------------------------------------------------------------


def check(inputs: dict[str, np.ndarray], spec) -> None:
    ids = inputs.get("input_ids")
    max_tokens = spec.config["max_tokens"]
    if ids is None or ids.dtype != np.int32 or ids.ndim != 1 or not 0 < len(ids) <= max_tokens:
        raise BadInput(f"expected 1 to {max_tokens} int32 token ids", code="bad_input")
    vocab = spec.config.get("vocab_size")
    if vocab and (ids.min() < 0 or ids.max() >= vocab):
        raise BadInput(f"token ids must lie in [0, {vocab})", code="bad_input")


def buckets(items: list[dict[str, np.ndarray]], spec) -> list[list[int]]:
    """Split a batch by length when padding to its longest text would waste most of the work.

    One 256-token text in a batch of short ones pads every row to 256: cheaper
    to run the short ones together and the long one apart. Splits only where
    it saves at least half the padded tokens and more than MIN_SAVED_TOKENS
    (a run has a fixed cost too); uniform batches stay whole.
    """
    order = sorted(range(len(items)), key=lambda i: len(items[i]["input_ids"]))
    return _split([len(items[i]["input_ids"]) for i in order], order)


MIN_SAVED_TOKENS = 512


def _split(lengths: list[int], order: list[int]) -> list[list[int]]:
    n, whole = len(lengths), len(lengths) * lengths[-1]
    best_k, best_cost = 0, whole
    for k in range(1, n):  # first k (shorter) in one run, the rest in another
        cost = k * lengths[k - 1] + (n - k) * lengths[-1]
        if cost < best_cost:
            best_k, best_cost = k, cost
    saved = whole - best_cost
    if best_k == 0 or saved < whole / 2 or saved < MIN_SAVED_TOKENS:
        return [order]
    return _split(lengths[:best_k], order[:best_k]) + [order[best_k:]]


def collate(items: list[dict[str, np.ndarray]], spec) -> dict[str, np.ndarray]:
    """Pad to the longest text of this batch, not to a fixed length."""
    longest = max(len(item["input_ids"]) for item in items)
    ids = np.zeros((len(items), longest), dtype=np.int64)
    mask = np.zeros((len(items), longest), dtype=np.int64)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n] = item["input_ids"]
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def postprocess(row: dict[str, np.ndarray], spec) -> dict:
    return {"embedding": np.asarray(row["embedding"], dtype=np.float32)}
