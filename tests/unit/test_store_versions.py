"""Model versions in the store: flat entries are version 1, version folders, the highest by default,
and write_model turning a flat entry into version folders."""

import json
import os
from pathlib import Path

import pytest

from funnel.common.store import list_models, list_versions, load_spec, version_path, write_model


def entry(store: Path, name: str, version: int | None = None, **config) -> Path:
    """A model folder written by hand: <name>/model.json (flat) or <name>/<version>/model.json."""
    folder = store / name if version is None else store / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.json").write_text(json.dumps({"task": "t", **config}))
    (folder / "weights.bin").write_bytes(f"{name} {version}".encode())
    return folder


def builder(marker: str, **config):
    def build(tmp: Path) -> dict:
        (tmp / "weights.bin").write_text(marker)
        return {"task": "t", "marker": marker, **config}
    return build


def test_a_flat_entry_is_version_1(tmp_path):
    entry(tmp_path, "flat", batch_size=8)
    assert list_versions(tmp_path, "flat") == [1]
    spec = load_spec(tmp_path, "flat")
    assert (spec.version, spec.path, spec.batch_size) == (1, tmp_path / "flat", 8)
    assert load_spec(tmp_path, "flat", 1) == spec
    with pytest.raises(FileNotFoundError, match="no version 2 of model 'flat'"):
        load_spec(tmp_path, "flat", 2)


def test_version_folders_and_the_highest_by_default(tmp_path):
    for version in (1, 2, 10):
        entry(tmp_path, "m", version, batch_size=version)
    (tmp_path / "m" / "3").mkdir()                      # no model.json: not a version (yet)
    (tmp_path / "m" / "02").mkdir()                     # not how a version is spelled
    entry(tmp_path / "m", "v4")                          # a folder named otherwise
    assert list_versions(tmp_path, "m") == [1, 2, 10]
    spec = load_spec(tmp_path, "m")
    assert (spec.name, spec.version, spec.path, spec.batch_size) == ("m", 10, tmp_path / "m" / "10", 10)
    assert spec.file("task") == tmp_path / "m" / "10" / "t"  # files resolve in the version
    two = load_spec(tmp_path, "m", 2)
    assert (two.version, two.path, two.batch_size) == (2, tmp_path / "m" / "2", 2)
    with pytest.raises(FileNotFoundError, match=r"it has 1, 2, 10"):
        load_spec(tmp_path, "m", 3)
    assert version_path(tmp_path, "m", 2) == tmp_path / "m" / "2"


def test_models_are_listed_with_at_least_one_version(tmp_path):
    entry(tmp_path, "flat")
    entry(tmp_path, "versioned", 2)
    (tmp_path / "empty" / "1").mkdir(parents=True)      # a version folder half written
    (tmp_path / "loose").mkdir()
    entry(tmp_path, ".hidden.tmp")                      # a build in progress
    assert list_models(tmp_path) == ["flat", "versioned"]
    assert list_versions(tmp_path, "empty") == list_versions(tmp_path, "absent") == []
    with pytest.raises(FileNotFoundError, match="no model 'empty'"):
        load_spec(tmp_path, "empty")
    assert list_models(tmp_path / "nowhere") == []


def test_linked_version_folders_count(tmp_path):
    """One folder linked in as two versions (what the tests do with the shipped text model)."""
    source = entry(tmp_path / "source", "text")
    for version in (1, 2):
        (tmp_path / "store" / "text").mkdir(parents=True, exist_ok=True)
        (tmp_path / "store" / "text" / str(version)).symlink_to(source, target_is_directory=True)
    assert list_versions(tmp_path / "store", "text") == [1, 2]
    assert load_spec(tmp_path / "store", "text").path == tmp_path / "store" / "text" / "2"


def test_write_model_without_a_version_writes_a_flat_entry_as_always(tmp_path):
    folder = write_model(tmp_path, "m", builder("one"))
    assert folder == tmp_path / "m" and (folder / "model.json").is_file()
    assert list_versions(tmp_path, "m") == [1]
    write_model(tmp_path, "m", builder("again"))         # replaced whole
    assert load_spec(tmp_path, "m").config["marker"] == "again"
    assert sorted(p.name for p in folder.iterdir()) == ["model.json", "weights.bin"]


def test_write_model_with_a_version_turns_a_flat_entry_into_version_folders(tmp_path):
    write_model(tmp_path, "m", builder("one"))
    (tmp_path / "m" / "extra").mkdir()
    (tmp_path / "m" / "extra" / "vocab.txt").write_text("words")
    inode = (tmp_path / "m" / "weights.bin").stat().st_ino
    folder = write_model(tmp_path, "m", builder("two"), version=2)
    assert folder == tmp_path / "m" / "2"
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["1", "2"]  # no flat file left
    assert list_versions(tmp_path, "m") == [1, 2]
    one, two = load_spec(tmp_path, "m", 1), load_spec(tmp_path, "m")
    assert (one.path, one.config["marker"]) == (tmp_path / "m" / "1", "one")
    assert (one.path / "extra" / "vocab.txt").read_text() == "words"
    assert (one.path / "weights.bin").stat().st_ino == inode  # linked, not copied
    assert (two.version, two.config["marker"], (two.path / "weights.bin").read_text()) == (2, "two", "two")
    assert one.config["name"] == two.config["name"] == "m"


def test_write_model_versions_replace_and_sit_beside_each_other(tmp_path):
    write_model(tmp_path, "m", builder("three"), version=3)  # a new entry: version folders at once
    assert list_versions(tmp_path, "m") == [3]
    write_model(tmp_path, "m", builder("one"), version=1)
    write_model(tmp_path, "m", builder("three again"), version=3)
    assert list_versions(tmp_path, "m") == [1, 3]
    assert load_spec(tmp_path, "m").config["marker"] == "three again"
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["1", "3"]  # nothing set aside left
    # Without a version, a versioned entry's version 1 is rewritten; the others stay.
    assert write_model(tmp_path, "m", builder("one again")) == tmp_path / "m" / "1"
    assert load_spec(tmp_path, "m", 1).config["marker"] == "one again"
    assert list_versions(tmp_path, "m") == [1, 3]


def test_write_model_version_1_over_a_flat_entry_replaces_it(tmp_path):
    write_model(tmp_path, "m", builder("flat"))
    write_model(tmp_path, "m", builder("one"), version=1)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["1"]
    assert load_spec(tmp_path, "m").config["marker"] == "one"


def test_a_failed_build_leaves_the_versions_as_they_were(tmp_path):
    write_model(tmp_path, "m", builder("one"))

    def broken(tmp: Path) -> dict:
        (tmp / "weights.bin").write_text("half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError):
        write_model(tmp_path, "m", broken, version=2)
    assert list_versions(tmp_path, "m") == [1] and load_spec(tmp_path, "m").path == tmp_path / "m"
    assert sorted(os.listdir(tmp_path)) == ["m"]            # no temporary folder left


def test_a_conversion_cut_short_still_reads_as_version_1(tmp_path):
    """A crash between linking the flat files into 1/ and removing them leaves both: version 1 once."""
    entry(tmp_path, "m", batch_size=4)
    entry(tmp_path, "m", 1, batch_size=4)
    assert list_versions(tmp_path, "m") == [1]
    assert load_spec(tmp_path, "m").path == tmp_path / "m" / "1"


@pytest.mark.parametrize("version", [0, -1, True])
def test_versions_are_positive_integers(tmp_path, version):
    entry(tmp_path, "m")
    with pytest.raises(ValueError, match="version"):
        load_spec(tmp_path, "m", version)
    with pytest.raises(ValueError, match="version"):
        write_model(tmp_path, "m", builder("x"), version=version)
