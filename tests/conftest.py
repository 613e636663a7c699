"""Shared fixtures: a real redis-server on a free port, the prepared model store, test images."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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


# The whole suite (`make test`: pytest with no paths, -k or -m) runs in two processes at once. Most tests
# wait on the processes they start more than they compute, and leave a core idle: the tests whose
# pass or failure does not hang on timing (UNTIMED) run in a second pytest process, started at
# collection. The main process runs the rest in ORDER, with the container images' build
# (tests/deploy/test_containers.py, Build, mostly one core: pip's downloads and installs) on a thread
# from collection on: the light tests first, then the tests that time failovers, replication and
# deadlines, the least sensitive first; the container tests once the build has had all of that to
# finish in; last QUIET's, each once the second process has ended. The second process's output is
# printed at the end; its failures fail the run.
CONTAINERS = "tests/deploy/test_containers.py"
QUIET = ("tests/faults/test_no_worker.py", "tests/faults/test_load_shedding.py",  # after the second process
         "tests/faults/test_redis_outage.py", "tests/faults/test_sentinel_failover.py", "tests/faults/test_chaos.py")
ORDER = ("tests/unit/", "tests/browser/", "tests/deploy/", "tests/integration/", "tests/faults/", CONTAINERS, *QUIET)
UNTIMED = ("tests/integration/", "tests/faults/test_bad_input.py", "tests/faults/test_batches_faults.py",
           "tests/faults/test_grpc_messages.py", "tests/faults/test_hostile_images.py",
           "tests/faults/test_jobs_faults.py", "tests/faults/test_non_ascii_digits.py",
           "tests/faults/test_security.py", "tests/faults/test_v2_bodies.py")
TIMED = ("tests/integration/test_sentinel.py", "tests/integration/test_replicas.py",  # never in the second process
         "tests/integration/test_cluster.py",
         "tests/integration/test_triton_config_stats.py",  # perf_analyzer's windows, against the server's counts
         "tests/integration/test_ocr_chain.py")  # the processes balanced: the chain tests in the second
PROCESSES_ENV = "FUNNEL_TEST_PROCESSES"  # =1 runs the whole suite in one process (the second process has it)
SECOND_TIMEOUT_S = 1500


def rank(nodeid: str) -> int:
    """Where a test goes in ORDER: its longest matching prefix's place (the rest last)."""
    matching = [prefix for prefix in ORDER if nodeid.startswith(prefix)]
    return ORDER.index(max(matching, key=len)) if matching else len(ORDER)


def untimed(nodeid: str) -> bool:
    return nodeid.startswith(UNTIMED) and not nodeid.startswith(TIMED)


class SecondProcess:
    """The second pytest process: its test files, its output in a file, its exit status."""

    def __init__(self, files: list[str], root: Path):
        self.output = tempfile.NamedTemporaryFile("w+", prefix="funnel-second-", suffix=".log", delete=False)
        self.process = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *files], cwd=root,
                                        env={**os.environ, PROCESSES_ENV: "1"}, stdout=self.output,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait(self) -> None:
        """Until the process ends (its status is read at the session's end)."""
        try:
            self.process.wait(SECOND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass  # finish kills it

    def finish(self, interrupted: bool) -> tuple[int, str]:
        try:
            if interrupted:
                self.process.terminate()
            status = self.process.wait(30 if interrupted else SECOND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            status = self.process.wait()
        self.output.seek(0)
        output = self.output.read()
        self.output.close()
        os.unlink(self.output.name)
        return status, output


SECOND: list[SecondProcess] = []


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: rank(item.nodeid))  # stable: each folder keeps its own order
    whole = (config.args_source != pytest.Config.ArgsSource.ARGS and not config.option.collectonly
             and not config.option.keyword and not config.option.markexpr)
    if whole and os.environ.get(PROCESSES_ENV) != "1":
        second = [item for item in items if untimed(item.nodeid)]
        if second and len(second) < len(items):
            items[:] = [item for item in items if not untimed(item.nodeid)]
            config.hook.pytest_deselected(items=second)
            files = sorted({item.nodeid.split("::")[0] for item in second})
            SECOND.append(SecondProcess(files, Path(str(config.rootpath))))
    containers = [item for item in items if item.nodeid.startswith(CONTAINERS)]
    if (containers and len(containers) < len(items) and not config.option.collectonly
            and os.environ.get("FUNNEL_TEST_CONTAINERS") != "0"):
        from tests.deploy.test_containers import BUILD
        BUILD.start()


def pytest_runtest_setup(item):
    if item.nodeid.startswith(QUIET):
        for second in SECOND:
            second.wait()


def pytest_sessionfinish(session, exitstatus):
    for second in SECOND:
        status, output = second.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        session.config.second_report = (status, output)
        if status != 0 and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = getattr(config, "second_report", None)
    if report is not None:
        status, output = report
        terminalreporter.section(f"the second process: the untimed tests, beside these (exit status {status})")
        terminalreporter.write(output)
