"""The model store: one folder per model, one folder per version, each described by its model.json.

    model_store/<name>/<version>/model.json   # versions 1, 2, ...: positive integers, as Triton numbers them
    model_store/<name>/model.json             # a flat entry, without version folders: version 1

An entry is either flat or all version folders: `write_model` with a version
turns a flat entry into `<name>/1/` first. A version folder may be a link
(the tests link one folder in as two versions). A folder, flat or versioned,
counts once its model.json is there: it is written last.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from funnel.common.contracts.keys import NAME_PATTERN, check_name, check_version

META = "model.json"


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    task: str
    path: Path  # the version's folder (the entry's own folder when it is flat)
    batch_size: int
    config: dict[str, Any] = field(repr=False, hash=False, compare=False)
    version: int = 1

    @property
    def store(self) -> Path:
        """The model store this version was read from."""
        return self.path.parent.parent if self.path.parent.name == self.name else self.path.parent

    def file(self, key: str) -> Path:
        """The path of a file named in model.json (onnx, torchscript, labels, ...)."""
        return self.path / self.config[key]

    def public(self) -> dict[str, Any]:
        """What GET /v1/models shows of any model; its task adds its own fields."""
        return {"name": self.name, "task": self.task, "batch_size": self.batch_size,
                **{k: self.config[k] for k in ("description", "inputs", "outputs") if k in self.config}}


def _version_name(text: str) -> int:
    """The version a folder's name is ("2" -> 2), else 0 ("02", "0", "v2", ".2.tmp" are none)."""
    if text.isascii() and text.isdigit() and text == str(int(text)) and int(text) > 0:
        return int(text)
    return 0


def _version_folders(entry: Path) -> dict[int, Path]:
    """The entry's complete version folders (holding a model.json), by version."""
    if not entry.is_dir():
        return {}
    found = {}
    for child in entry.iterdir():
        version = _version_name(child.name)
        if version and (child / META).is_file():
            found[version] = child
    return found


def _is_flat(entry: Path) -> bool:
    return (entry / META).is_file()


def list_versions(store: str | Path, name: str) -> list[int]:
    """The model's versions in the store, ascending; [] when it has none (a flat entry is [1])."""
    entry = Path(store) / check_name(name)
    folders = _version_folders(entry)
    if folders:
        # A flat model.json beside version folders is a conversion cut short: its files are
        # already in 1/ (write_model links them there before it removes them).
        return sorted(folders)
    return [1] if _is_flat(entry) else []


def version_path(store: str | Path, name: str, version: int) -> Path:
    """The folder of one version: <name>/<version>/, or <name>/ for a flat entry's version 1."""
    entry = Path(store) / check_name(name)
    folders = _version_folders(entry)
    if folders:
        return folders.get(check_version(version), entry / str(version))
    return entry if check_version(version) == 1 and _is_flat(entry) else entry / str(version)


def load_spec(store: str | Path, name: str, version: int | None = None) -> ModelSpec:
    """The spec of one version of a model (None: its highest version)."""
    check_name(name)
    versions = list_versions(store, name)
    if not versions:
        raise FileNotFoundError(f"no model {name!r} in {store} (run: funnel prepare --store {store})")
    if version is None:
        version = versions[-1]
    elif check_version(version) not in versions:
        raise FileNotFoundError(f"no version {version} of model {name!r} in {store} "
                                f"(it has {', '.join(map(str, versions))})")
    folder = version_path(store, name, version)
    config = json.loads((folder / META).read_text())
    return ModelSpec(name=name, task=config["task"], path=folder,
                     batch_size=int(config.get("batch_size", 16)), config=config, version=version)


def list_models(store: str | Path) -> list[str]:
    """Every model with at least one version, by name."""
    root = Path(store)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if NAME_PATTERN.match(p.name) and list_versions(root, p.name))


def _link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows one (no bytes copied), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _to_version_folders(store: Path, name: str) -> None:
    """Turn a flat entry into <name>/1/: its files linked into a new folder, model.json last,
    swapped in whole; then the flat files go, model.json first. A reader sees version 1 at
    every moment (list_versions prefers version folders)."""
    entry = store / name
    tmp = store / f".{name}.1.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    flat = [child for child in entry.iterdir() if not child.name.startswith(".")
            and not _version_name(child.name) and child.name != META]
    try:
        for child in flat:
            if child.is_dir():
                shutil.copytree(child, tmp / child.name, copy_function=_link_or_copy, symlinks=True)
            else:
                _link_or_copy(str(child), str(tmp / child.name))
        _link_or_copy(str(entry / META), str(tmp / META))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.rename(entry / "1")
    _remove_flat(entry, flat)


def _remove_flat(entry: Path, files: list[Path]) -> None:
    (entry / META).unlink(missing_ok=True)  # first: the entry stops being flat at once
    for child in files:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def write_model(store: str | Path, name: str, build: Callable[[Path], dict[str, Any]],
                version: int | None = None) -> Path:
    """Build a model folder and swap it in whole: build(tmp folder) puts the files, returns model.json.

    model.json is written last: its presence marks a complete folder, so a
    build that fails half way leaves the old folder (or none), never a broken one.

    version None writes version 1 as the entry has it: a flat folder, as always, unless the
    entry already has version folders (then <name>/1/; the others are left alone). A version N
    writes <name>/<N>/, after turning a flat entry into <name>/1/ (so an entry is either flat
    or all version folders). Returns the folder written.
    """
    check_name(name)
    store = Path(store)
    entry = store / name
    flat = _is_flat(entry) and not _version_folders(entry)
    versioned = version is not None or bool(_version_folders(entry))
    number = check_version(version) if version is not None else 1
    folder = entry / str(number) if versioned else entry
    tmp = store / (f".{name}.{number}.tmp" if versioned else f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = {**build(tmp), "name": name}
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not versioned:
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder
    entry.mkdir(parents=True, exist_ok=True)
    if flat:
        if number == 1:  # the flat files are version 1's old files: replaced, not kept
            flat_files = [c for c in entry.iterdir() if not c.name.startswith(".") and c.name != META
                          and not _version_name(c.name)]
            tmp.rename(folder)
            _remove_flat(entry, flat_files)
            return folder
        _to_version_folders(store, name)
    old = entry / f".{number}.old"
    if folder.is_symlink() or folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)  # aside, then the new one in: two renames, never a half-written folder
    tmp.rename(folder)
    if old.is_symlink():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)
    return folder
