"""A cached model's repeated items are not preprocessed again (web/recently_prepared.py): per scope, bounded,
least recently used out, and read-only."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from funnel.common import tasks
from funnel.common.store import load_spec
from funnel.web.pipeline import Pipeline
from funnel.web.recently_prepared import ENTRY_BYTES, RecentlyPrepared
from tests.support import TEXT, cached_store


class Counting:
    """A task whose preprocess calls are counted."""

    def __init__(self, task):
        self.task, self.calls = task, 0
        self.spec, self.cache = task.spec, task.cache

    def preprocess(self, item):
        self.calls += 1
        return self.task.preprocess(item)


@pytest.fixture(scope="module")
def cached_task(model_store, tmp_path_factory):
    store = cached_store(model_store, tmp_path_factory.mktemp("recently-prepared"))
    return tasks.load(load_spec(store, TEXT))


def prepared(pipeline, task, items, owner=""):
    return list(Pipeline.prepare(pipeline, task, items, False, owner))


def test_a_repeated_text_is_prepared_once_per_scope(cached_task):
    pipeline, task = SimpleNamespace(recently_prepared=RecentlyPrepared()), Counting(cached_task)
    first = prepared(pipeline, task, ["a repeated text", "another"])
    again = prepared(pipeline, task, ["another", "a repeated text"])
    assert task.calls == 2
    for name in first[0][0]:
        np.testing.assert_array_equal(again[1][0][name], first[0][0][name])
        assert not again[1][0][name].flags.writeable  # shared by later requests
    prepared(pipeline, task, ["a repeated text"], owner="0123456789abcdef" * 4)
    assert task.calls == 3, "a key's items are its own, even here"


def test_models_that_do_not_cache_prepare_every_time(model_store):
    task = Counting(tasks.load(load_spec(model_store, TEXT)))
    pipeline = SimpleNamespace(recently_prepared=RecentlyPrepared())
    prepared(pipeline, task, ["the same", "the same"])
    assert task.calls == 2 and pipeline.recently_prepared.size == 0


def test_bounded_least_recently_used_out():
    memo = RecentlyPrepared(max_bytes=3 * (ENTRY_BYTES + 200))
    arrays = {"x": np.zeros(100, np.uint8)}
    for text in ("a", "b", "c"):
        memo.put(("m", 1, "shared", text), dict(arrays), None)
    assert memo.get(("m", 1, "shared", "a")) is not None  # now the most recent
    memo.put(("m", 1, "shared", "d"), dict(arrays), None)
    assert memo.get(("m", 1, "shared", "b")) is None
    assert all(memo.get(("m", 1, "shared", t)) is not None for t in ("a", "c", "d"))
    assert memo.size <= memo.max_bytes
    memo.put(("m", 1, "shared", "huge"), {"x": np.zeros(10_000, np.uint8)}, None)  # larger than it all
    assert memo.get(("m", 1, "shared", "huge")) is None and memo.get(("m", 1, "shared", "d")) is not None
