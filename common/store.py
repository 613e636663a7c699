"""The model store: one folder per model, described by its model.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.keys import check_name


@dataclass(frozen=True)
class ModelSpec:
    name: str
    task: str
    path: Path
    batch_size: int
    config: dict[str, Any] = field(repr=False, hash=False, compare=False)

    def file(self, key: str) -> Path:
        """The path of a file named in model.json (onnx, torchscript, labels, ...)."""
        return self.path / self.config[key]

    def public(self) -> dict[str, Any]:
        """What GET /v1/models shows of this model."""
        keep = ("task", "description", "inputs", "outputs", "preprocess", "top_k",
                "max_tokens", "dim")
        return {"name": self.name, "batch_size": self.batch_size,
                **{k: self.config[k] for k in keep if k in self.config}}


def load_spec(store: str | Path, name: str) -> ModelSpec:
    check_name(name)
    folder = Path(store) / name
    meta_path = folder / "model.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"no model {name!r} in {store} (run: python scripts/prepare_model.py --store {store})")
    config = json.loads(meta_path.read_text())
    return ModelSpec(name=name, task=config["task"], path=folder,
                     batch_size=int(config.get("batch_size", 16)), config=config)


def list_models(store: str | Path) -> list[str]:
    root = Path(store)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "model.json").is_file())
