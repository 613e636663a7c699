"""A version whose folder leaves the store keeps serving from memory until the catalog drops it: the
web side's files (the tokenizer) are read when the version is loaded, not at its first request."""

from __future__ import annotations

import shutil

from funnel.web.catalog import Catalog

TEXT = "text-embedding"


def test_a_removed_version_preprocesses_until_the_next_scan(model_store, tmp_path):
    folder = tmp_path / TEXT / "2"
    folder.mkdir(parents=True)
    for name in ("model.json", "tokenizer.json"):
        shutil.copy(model_store / TEXT / name, folder / name)
    catalog = Catalog(str(tmp_path), [], {})
    task = catalog.versions(TEXT)[2]
    shutil.rmtree(folder)  # gone before any request reached it
    assert len(task.preprocess("still served from memory")["input_ids"]) > 2
    catalog.rescan()
    assert catalog.versions(TEXT) == {}
