"""The web tier's view of model versions: the catalog follows the store, the policy picks a version."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter

import pytest

from funnel.common.contracts import registry, repository, traffic
from funnel.web.catalog import Catalog
from funnel.web.queueing.shedding import WorkerView
from funnel.web.queueing.versions import Versions

TEXT = "text-embedding"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(model_store, tmp_path):
    root = tmp_path / "store"
    (root / TEXT).mkdir(parents=True)
    (root / TEXT / "1").symlink_to(model_store / TEXT, target_is_directory=True)
    return root


def test_the_catalog_serves_versions_added_and_removed_while_it_runs(store, model_store, caplog):
    clock = Clock()
    catalog = Catalog(store, [], {}, rescan_s=5.0, clock=clock)
    assert catalog.names() == [TEXT] and list(catalog.versions(TEXT)) == [1]
    (store / TEXT / "2").symlink_to(model_store / TEXT, target_is_directory=True)
    clock.now = 4.9
    assert list(catalog.versions(TEXT)) == [1]  # not looked at again yet
    clock.now = 5.0
    assert sorted(catalog.versions(TEXT)) == [1, 2]
    assert catalog.versions(TEXT)[2].spec.version == 2
    first = catalog.versions(TEXT)[1]
    (store / TEXT / "1").unlink()
    broken = store / "broken"
    broken.mkdir()
    (broken / "model.json").write_text(json.dumps({"task": "no.such:Task"}))
    clock.now = 10.0
    assert list(catalog.versions(TEXT)) == [2] and catalog.names() == [TEXT]  # the broken one left out
    assert "broken" in caplog.text
    (store / TEXT / "1").symlink_to(model_store / TEXT, target_is_directory=True)
    clock.now = 15.0
    assert catalog.versions(TEXT)[1] is first  # loaded once, kept while its model.json is unchanged
    shutil.rmtree(broken)


def publish(client, keys, worker_id: str, version: int) -> None:
    registry.publish(client, keys, worker_id, {"model": TEXT, "version": version, "batch_size": 8}, ttl_s=30)


def test_a_request_goes_by_weight_to_live_versions_and_to_the_highest_live_one_without_a_policy(redis_client,
                                                                                               keys):
    clock = Clock()
    workers = WorkerView(redis_client, keys, clock=clock)
    versions = Versions(redis_client, keys, workers, clock=clock, rng=random.Random(7))
    publish(redis_client, keys, "w1", 1)
    assert versions.choose(TEXT, [1, 2]) == 1  # version 2 has no worker yet
    publish(redis_client, keys, "w2", 2)
    clock.now = 2.0  # the next view of the workers
    assert versions.choose(TEXT, [1, 2]) == 2  # no policy: the highest live version
    traffic.write(redis_client, keys, TEXT, {1: 90, 2: 10})
    clock.now = 4.0
    drawn = Counter(versions.choose(TEXT, [1, 2]) for _ in range(5000))
    assert abs(drawn[2] / 5000 - 0.10) < 0.02, drawn
    redis_client.delete(keys.worker(TEXT, "w2"))  # version 2's worker is gone
    traffic.write(redis_client, keys, TEXT, {1: 0, 2: 100})
    clock.now = 6.0
    assert {versions.choose(TEXT, [1, 2]) for _ in range(50)} == {1}  # its weight skipped, not a 503
    assert versions.choose(TEXT, [2]) == 2  # nothing live in the store's versions: the highest, for the 503


def test_unloaded_versions_are_read_with_the_policy_and_a_drain_counts_what_each_version_holds(redis_client,
                                                                                              keys):
    clock = Clock()
    versions = Versions(redis_client, keys, WorkerView(redis_client, keys, clock=clock), clock=clock)
    assert versions.unloaded(TEXT) == frozenset()
    repository.unload(redis_client, keys, TEXT, [2])
    assert versions.unloaded(TEXT) == frozenset()  # read at most every refresh
    clock.now = 2.0
    assert versions.unloaded(TEXT) == {2} == repository.read(redis_client, keys, TEXT)
    redis_client.sadd(keys.unloaded(TEXT), "not-a-version")  # written by hand: left out
    assert repository.read(redis_client, keys, TEXT) == {2}
    repository.load(redis_client, keys, TEXT, [2])
    assert repository.read(redis_client, keys, TEXT) == frozenset()

    publish(redis_client, keys, "w1", 1)
    publish(redis_client, keys, "w2", 2)
    publish(redis_client, keys, "gone", 1)
    redis_client.delete(keys.worker(TEXT, "gone"))  # a dead worker: listed, its hash expired
    assert [repository.holding(redis_client, keys, TEXT, [v]) for v in (1, 2)] == [0, 0]
    redis_client.lpush(keys.queue(TEXT, 2, "high"), b"job")
    redis_client.lpush(keys.bulk(TEXT, 2), b"job")
    redis_client.lpush(keys.inflight(TEXT, "w2"), b"job")
    redis_client.lpush(keys.inflight(TEXT, "w1"), b"job")
    assert [repository.holding(redis_client, keys, TEXT, [v]) for v in (1, 2)] == [1, 3]
    redis_client.lpush(keys.recovering(TEXT, "gone"), b"job")  # whatever version it served: counted for each
    assert [repository.holding(redis_client, keys, TEXT, [v]) for v in (1, 2)] == [2, 4]
