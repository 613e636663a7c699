"""Sentence embedding: token ids in, a mean-pooled L2-normalised vector out."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from funnel.common.errors import BadInput
from funnel.common.tasks.base import Context, Inputs, Task
from funnel.common.tasks.buckets import group_by_width

# What one more run costs, in padded tokens (model.json's "run_cost_tokens" overrides it). On the CPU a
# run's fixed cost is worth about 10 tokens (benchmarks/buckets.py); the margin keeps near-uniform batches
# whole. On a GPU a call is worth over a thousand tokens (docs/models.md, "Variable-width inputs").
RUN_COST_TOKENS = 64


class TextEmbedding(Task):
    """model.json: "tokenizer" (a tokenizers JSON file), "max_tokens", "dim", "vocab_size"."""

    input_kind = "text"
    default_limits = {"max_chars": 20_000}  # checked before tokenizing, which costs CPU per character

    # -- web side ------------------------------------------------------------

    def load_files(self) -> None:
        _ = self.ascii_tokenizer  # and the tokenizer it is made from

    @functools.cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.spec.file("tokenizer")))

    @functools.cached_property
    def ascii_tokenizer(self):
        """The tokenizer for printable ASCII text: the same, with a cheaper normalizer where it can have one.

        BERT's normalizer decomposes every character (NFD) to strip accents, drops control
        characters and spaces out CJK ones; on printable ASCII none of that changes anything,
        and all it does is lowercase. Lowercasing alone makes tokenizing a sentence about a
        third cheaper (tests/unit/test_tasks.py checks that both give the same ids).
        """
        from tokenizers import Tokenizer, normalizers

        normalizer = self.tokenizer.normalizer
        if not isinstance(normalizer, normalizers.BertNormalizer):
            return self.tokenizer
        ascii_only = Tokenizer.from_file(str(self.spec.file("tokenizer")))
        ascii_only.normalizer = normalizers.Lowercase() if normalizer.lowercase else None
        return ascii_only

    @property
    def max_tokens(self) -> int:
        return int(self.spec.config["max_tokens"])

    def preprocess(self, item: str) -> Inputs:
        if not item.strip():
            raise BadInput("text is empty", code="empty_input")
        if len(item) > self.limits["max_chars"]:
            raise BadInput(f"text has {len(item)} characters; the limit is {self.limits['max_chars']}",
                           code="text_too_long")
        tokenizer = self.ascii_tokenizer if item.isascii() and item.isprintable() else self.tokenizer
        ids = tokenizer.encode(item).ids
        if len(ids) > self.max_tokens:
            raise BadInput(f"text is {len(ids)} tokens long; this model takes at most {self.max_tokens}",
                           code="text_too_long")
        return {"input_ids": np.asarray(ids, dtype=np.int32)}

    def public(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "dim": self.spec.config.get("dim")}

    def output_shapes(self) -> dict[str, list[int]]:
        return {"embedding": [int(self.spec.config.get("dim", -1))]}

    # -- worker side ---------------------------------------------------------

    def check(self, inputs: Inputs) -> None:
        ids = inputs.get("input_ids")
        if ids is None or ids.dtype != np.int32 or ids.ndim != 1 or not 0 < len(ids) <= self.max_tokens:
            raise BadInput(f"expected 1 to {self.max_tokens} int32 token ids", code="bad_input")
        vocab = self.spec.config.get("vocab_size")
        if vocab and (ids.min() < 0 or ids.max() >= vocab):
            raise BadInput(f"token ids must lie in [0, {vocab})", code="bad_input")

    def buckets(self, items: list[Inputs]) -> list[list[int]]:
        """Split a batch by length where padding to its longest text would waste more than a run costs.

        One 256-token text in a batch of short ones pads every row to 256: cheaper
        to run the short ones together and the long one apart. `group_by_width`
        picks the runs that pad to the fewest tokens, counting RUN_COST_TOKENS
        per run; uniform batches stay whole.
        """
        return group_by_width([len(item["input_ids"]) for item in items], self.run_cost_tokens)

    @property
    def run_cost_tokens(self) -> float:
        return float(self.spec.config.get("run_cost_tokens", RUN_COST_TOKENS))

    def warmup_inputs(self) -> list[Inputs]:
        """Texts of 16, 32, ... tokens up to the longest the model takes: a batch pads to its longest."""
        lengths = [n for n in (16, 32, 64, 128, 256, 512) if n < self.max_tokens] + [self.max_tokens]
        return [{"input_ids": np.ones(n, dtype=np.int32)} for n in lengths]

    def collate(self, items: list[Inputs]) -> dict[str, np.ndarray]:
        """Pad to the longest text of this batch, not to a fixed length."""
        longest = max(len(item["input_ids"]) for item in items)
        ids = np.zeros((len(items), longest), dtype=np.int64)
        mask = np.zeros((len(items), longest), dtype=np.int64)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, :n] = item["input_ids"]
            mask[row, :n] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def postprocess(self, row: dict[str, np.ndarray], context: Context | None = None) -> dict[str, Any]:
        return {"embedding": np.asarray(row["embedding"], dtype=np.float32)}

