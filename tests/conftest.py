"""Shared fixtures: a real redis-server on a free port, the prepared model store, test images."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import LocalCluster, LocalRedis, LocalSentinels
from tests.support import STORE, jpeg_bytes


@pytest.fixture(scope="session")
def model_store() -> Path:
    """The store `make test` prepared (prepared here if the suite runs on its own)."""
    from funnel.scripts.prepare_model import DEFAULT_MODELS, is_current, prepare

    for name in DEFAULT_MODELS:
        if not is_current(STORE / name):
            prepare(STORE, name)
    return STORE


@pytest.fixture(scope="session")
def fp16_store(model_store, tmp_path_factory) -> Path:
    """A store with both fp16 variants (prepare_model.py --half), built once beside links to
    the fp32 folders."""
    from funnel.scripts.prepare_model import DEFAULT_MODELS, prepare_half

    store = tmp_path_factory.mktemp("fp16-store")
    for name in DEFAULT_MODELS:
        (store / name).symlink_to(model_store / name, target_is_directory=True)
        prepare_half(store, name)
    return store


@pytest.fixture(scope="session")
def redis_server():
    with LocalRedis() as server:
        yield server


@pytest.fixture()
def sentinels():
    """A primary, a replica and three Sentinels on 127.0.0.1, fresh for each test (a failover
    changes which is the primary): FUNNEL_REDIS_URL is sentinels.url."""
    with LocalSentinels() as deployment:
        yield deployment


@pytest.fixture(scope="module")
def redis_cluster():
    """Three cluster-enabled primaries on 127.0.0.1 joined by `redis-cli --cluster create`, up to
    cluster_state:ok: FUNNEL_REDIS_URL is redis_cluster.url (redis+cluster://)."""
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture()
def redis_client(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture()
def keys() -> Keys:
    return Keys("funnel")


@pytest.fixture(scope="session")
def cat_jpeg() -> bytes:
    """scikit-image's bundled photo of Chelsea the cat, as a JPEG."""
    from skimage import data

    return jpeg_bytes(data.chelsea())


@pytest.fixture(scope="session")
def coffee_jpeg() -> bytes:
    from skimage import data

    return jpeg_bytes(data.coffee())


# The order the suite runs its tests in. The container images build on a thread from collection on
# (tests/deploy/test_containers.py, Build), mostly on one core (pip's downloads and installs): beside
# it run the tests whose pass or failure does not hang on timing, the unit, browser, offline deploy
# and integration tests. Then the container tests (which wait for the build, if it is still going),
# and last, with the cores to themselves, the tests that time failovers, replication and load.
CONTAINERS = "tests/deploy/test_containers.py"
ORDER = ("tests/unit/", "tests/browser/", "tests/deploy/", "tests/integration/", CONTAINERS,
         "tests/integration/test_sentinel.py", "tests/integration/test_replicas.py",
         "tests/integration/test_cluster.py", "tests/faults/")


def rank(nodeid: str) -> int:
    """Where a test goes in ORDER: its longest matching prefix's place (the rest last)."""
    matching = [prefix for prefix in ORDER if nodeid.startswith(prefix)]
    return ORDER.index(max(matching, key=len)) if matching else len(ORDER)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: rank(item.nodeid))  # stable: each folder keeps its own order
    containers = [item for item in items if item.nodeid.startswith(CONTAINERS)]
    if (containers and len(containers) < len(items) and not config.option.collectonly
            and os.environ.get("FUNNEL_TEST_CONTAINERS") != "0"):
        from tests.deploy.test_containers import BUILD
        BUILD.start()
