"""The model store: one folder per model, described by its model.json."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from funnel.common.keys import check_name


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
        """What GET /v1/models shows of any model; its task adds its own fields."""
        return {"name": self.name, "task": self.task, "batch_size": self.batch_size,
                **{k: self.config[k] for k in ("description", "inputs", "outputs") if k in self.config}}


def load_spec(store: str | Path, name: str) -> ModelSpec:
    check_name(name)
    folder = Path(store) / name
    meta_path = folder / "model.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no model {name!r} in {store} (run: funnel prepare --store {store})")
    config = json.loads(meta_path.read_text())
    return ModelSpec(name=name, task=config["task"], path=folder,
                     batch_size=int(config.get("batch_size", 16)), config=config)


def list_models(store: str | Path) -> list[str]:
    root = Path(store)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "model.json").is_file())


def write_model(store: str | Path, name: str, build: Callable[[Path], dict[str, Any]]) -> Path:
    """Build a model folder and swap it in whole: build(tmp folder) puts the files, returns model.json.

    model.json is written last: its presence marks a complete folder, so a
    build that fails half way leaves the old folder (or none), never a broken one.
    """
    check_name(name)
    folder = Path(store) / name
    tmp = Path(store) / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = {**build(tmp), "name": name}
        (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder
