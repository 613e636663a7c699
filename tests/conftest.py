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


# The order the suite runs its folders in: the container images build on a thread from collection on
# (tests/deploy/test_containers.py, Build) beside the light tests first, whose pass or failure does not
# hang on timing; the container tests then wait for the build, and the fault and integration tests,
# which time failovers and load, run after it with the cores to themselves.
ORDER = ("tests/unit/", "tests/browser/", "tests/deploy/test_containers.py", "tests/deploy/")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(ORDER) if item.nodeid.startswith(prefix)), len(ORDER))

    items.sort(key=rank)  # stable: each folder keeps its own order
    containers = [item for item in items if item.nodeid.startswith(ORDER[2])]
    if (containers and len(containers) < len(items) and not config.option.collectonly
            and os.environ.get("FUNNEL_TEST_CONTAINERS") != "0"):
        from tests.deploy.test_containers import BUILD
        BUILD.start()
