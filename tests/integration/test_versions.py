"""Model versions against a real redis-server: workers of versions 1 and 2 of the text model each
take only their own version's queue and answer with their version; a killed version-2 worker's
jobs go back to version 2's queue (recovered by a version-1 peer) and are answered by version 2;
`funnel add --version`, `funnel traffic` and `funnel inspect`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import msgpack
import numpy as np
import pytest

from funnel.common import tasks
from funnel.common.contracts import registry, traffic, wire
from funnel.common.contracts.wire import Job
from funnel.common.store import list_versions, load_spec
from funnel.worker.settings import WorkerSettings, model_and_version
from tests import support, toy_model
from tests.support import wait_for

MODEL = "text-embedding"
FUNNEL = str(Path(sys.executable).parent / "funnel")


@pytest.fixture(scope="module")
def versioned_store(model_store, tmp_path_factory) -> Path:
    """The shipped text model linked in as versions 1 and 2 of text-embedding."""
    store = tmp_path_factory.mktemp("versioned-store")
    (store / MODEL).mkdir()
    for version in (1, 2):
        (store / MODEL / str(version)).symlink_to(model_store / MODEL, target_is_directory=True)
    assert list_versions(store, MODEL) == [1, 2]
    return store


@pytest.fixture(scope="module")
def task(versioned_store):
    return tasks.load(load_spec(versioned_store, MODEL, 1))


def running_worker(redis_server, store, model: str, worker_id: str, **flags):
    """A worker on a thread, for `model` as --model takes it: NAME or NAME:N; one ONNX thread."""
    return support.running_worker(redis_server, store, model, worker_id, intra_op_threads=1, **flags)


def text_job(task, keys, text: str, version: int) -> Job:
    job_id = uuid.uuid4().hex
    return Job(id=job_id, model=MODEL, items=[task.preprocess(text)], reply_to=keys.reply(MODEL, job_id),
               deadline=wire.now_ms() + 60_000, version=version)


def push(client, keys, jobs: list[Job], version: int) -> None:
    client.lpush(keys.queue(MODEL, version), *[wire.encode_job(j) for j in jobs])


def await_reply(client, job: Job, timeout: float = 60) -> wire.Reply:
    got = client.blpop([job.reply_to], timeout=timeout)
    assert got is not None, f"no reply for {job.id}"
    reply = wire.decode_reply(got[1])
    assert reply.id == job.id
    return reply



def live_versions(client, keys) -> dict[str, int]:
    """Each live worker's id -> the version it publishes."""
    return {w["id"]: registry.version_of(w) for w in registry.live_workers(client, keys) if w.get("model") == MODEL}


def test_the_model_flag_takes_a_version():
    assert model_and_version("text-embedding") == ("text-embedding", None)
    assert model_and_version("text-embedding:2") == ("text-embedding", 2)
    for bad in ("text-embedding:0", "text-embedding:x", "text-embedding:02", "text-embedding:", "a b:1"):
        with pytest.raises(ValueError):
            model_and_version(bad)
    with pytest.raises(SystemExit, match="text-embedding:x"):
        WorkerSettings.load(["--model", "text-embedding:x"])


def test_each_version_takes_only_its_own_queue_and_names_itself(redis_client, redis_server, versioned_store,
                                                                 task, keys):
    texts = [f"sentence {i}: {'a man is eating food ' * (i % 3)}" for i in range(12)]
    with ExitStack() as workers:
        workers.enter_context(running_worker(redis_server, versioned_store, f"{MODEL}:1", "w-v1"))
        workers.enter_context(running_worker(redis_server, versioned_store, MODEL, "w-v2"))  # the highest: 2
        wait_for(lambda: live_versions(redis_client, keys) == {"w-v1": 1, "w-v2": 2}, what="both registered")
        assert registry.versions_live(registry.live_workers(redis_client, keys), MODEL) == {1, 2}
        ones = [text_job(task, keys, t, 1) for t in texts]
        twos = [text_job(task, keys, t, 2) for t in texts]
        push(redis_client, keys, ones, 1)
        push(redis_client, keys, twos, 2)
        # A job from before versions (no field) is version 1's.
        legacy = text_job(task, keys, "an old web's job", 1)
        old = msgpack.unpackb(wire.encode_job(legacy), raw=False)
        del old["version"]
        redis_client.lpush(keys.queue(MODEL, 1), msgpack.packb(old, use_bin_type=True))
        # A version-1 job on version 2's queue (pushed by hand) is not version 2's to run.
        stray = text_job(task, keys, "on the wrong queue", 1)
        redis_client.lpush(keys.queue(MODEL, 2), wire.encode_job(stray))
        got_ones = [await_reply(redis_client, j) for j in ones]
        got_twos = [await_reply(redis_client, j) for j in twos]
        assert await_reply(redis_client, legacy).version == 1
        refused = await_reply(redis_client, stray)

        # funnel inspect and funnel traffic, against the live workers.
        url = ["--redis-url", redis_server.url]
        set_out = subprocess.run([FUNNEL, "traffic", MODEL, "1=90", "2=10", *url, "--model-store",
                                  str(versioned_store)], capture_output=True, text=True, timeout=60)
        assert set_out.returncode == 0, set_out.stderr
        assert traffic.read(redis_client, keys, MODEL) == {1: 90, 2: 10}
        assert "traffic 1=90 2=10" in set_out.stdout and "live workers 1" in set_out.stdout
        inspected = subprocess.run([FUNNEL, "inspect", *url], capture_output=True, text=True, timeout=60)
        assert inspected.returncode == 0, inspected.stderr
        rows = {tuple(line.split()[:3]) for line in inspected.stdout.splitlines()}
        assert (MODEL, "1", "1") in rows and (MODEL, "2", "1") in rows, inspected.stdout
        assert "traffic 1=90 2=10; unpinned requests go to version 1 90%, version 2 10%" in inspected.stdout
        speaks = f"speaks wire {wire.JOB_FORMAT}, lanes"
        assert f"w-v2: text-embedding onnx cpu batch 32 | version 2 | {speaks} |" in inspected.stdout
    assert all(r.ok and r.version == 1 and r.worker == "w-v1" for r in got_ones)
    assert all(r.ok and r.version == 2 and r.worker == "w-v2" for r in got_twos)
    # The same model linked in twice: the same embeddings from either version.
    for one, two in zip(got_ones, got_twos):
        np.testing.assert_allclose(one.outputs["embedding"], two.outputs["embedding"], atol=1e-5)
    assert not refused.ok and refused.error["code"] == "bad_job" and refused.version == 2
    assert "version 1" in refused.error["message"]
    assert [wire.decode_job(r).id for r in redis_client.lrange(keys.dead(MODEL), 0, -1)] == [stray.id]
    for version in (1, 2):
        assert redis_client.llen(keys.queue(MODEL, version)) == 0


def worker_process(redis_server, store, model: str, worker_id: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUNNEL_")}
    env.update(FUNNEL_REDIS_URL=redis_server.url, FUNNEL_MODEL_STORE=str(store), FUNNEL_MODEL=model,
               FUNNEL_WORKER_ID=worker_id, FUNNEL_HEARTBEAT_TTL_S="2", FUNNEL_BATCH_SIZE="4",
               FUNNEL_INTRA_OP_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "funnel.worker"], env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)


def freeze_holding_jobs(client, keys, proc: subprocess.Popen, worker_id: str, timeout_s: float = 60) -> list[str]:
    """SIGSTOP the worker at a moment it holds jobs; the ids it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        os.kill(proc.pid, signal.SIGSTOP)
        held = client.lrange(keys.inflight(MODEL, worker_id), 0, -1)
        if held:
            return [wire.decode_job(raw).id for raw in held]
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    raise TimeoutError(f"worker {worker_id} never held a job")


def test_a_killed_version_2_workers_jobs_go_back_to_version_2(redis_client, redis_server, versioned_store,
                                                               task, keys, tmp_path):
    jobs = [text_job(task, keys, f"crash test {i}: {'the quick brown fox ' * (i % 4)}", 2) for i in range(200)]
    victim = worker_process(redis_server, versioned_store, f"{MODEL}:2", "victim", tmp_path / "victim.log")
    try:
        def alive() -> None:
            if victim.poll() is not None:
                raise RuntimeError(f"the victim exited with {victim.returncode}: "
                                   f"{(tmp_path / 'victim.log').read_text()[-2000:]}")

        wait_for(lambda: live_versions(redis_client, keys).get("victim") == 2, what="victim registered",
                 check=alive)
        # A version-1 worker is the only live peer: its heartbeat thread recovers the victim's jobs.
        with running_worker(redis_server, versioned_store, f"{MODEL}:1", "peer-v1", heartbeat_ttl_s=2):
            push(redis_client, keys, jobs, 2)
            held = freeze_holding_jobs(redis_client, keys, victim, "victim")
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            wait_for(lambda: not redis_client.hexists(keys.workers(), "victim"), what="the victim recovered")
            # No version-2 worker is live: the recovered jobs wait on version 2's queue, at its head.
            waiting = [wire.decode_job(raw) for raw in redis_client.lrange(keys.queue(MODEL, 2), 0, -1)[::-1]]
            assert [j.id for j in waiting[:len(held)]] == held[::-1]  # oldest first, taken next
            assert {(j.version, j.attempt) for j in waiting[:len(held)]} == {(2, 1)}
            assert redis_client.llen(keys.queue(MODEL, 1)) == 0 and not redis_client.exists(
                keys.inflight(MODEL, "victim"))
            # The count reaches the peer's hash on its next heartbeat.
            recovered = wait_for(lambda: int(worker_hash(redis_client, keys, "peer-v1").get("recovered", 0)),
                                 what="the peer's recovered count")
            with running_worker(redis_server, versioned_store, f"{MODEL}:2", "replacement"):
                replies = {job.id: await_reply(redis_client, job) for job in jobs}
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert all(r.ok and r.version == 2 for r in replies.values())
    assert {replies[job_id].worker for job_id in held} == {"replacement"}
    assert {r.worker for r in replies.values()} <= {"victim", "replacement"}
    assert all(redis_client.llen(job.reply_to) == 0 for job in jobs)  # each answered once
    assert recovered >= len(held) > 0


def worker_hash(client, keys, worker_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(keys.worker(MODEL, worker_id)).items()}


def test_funnel_add_adds_a_version_beside_the_others(tmp_path):
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    first = toy_model.add_toy(store, work, "toy")
    assert first.returncode == 0, first.stderr
    assert (store / "toy" / "model.json").is_file()            # without --version: flat, as always
    second = toy_model.add_toy(store, work, "toy", "toyscore.tasks:VectorScore", "--version", "2")
    assert second.returncode == 0, second.stderr
    assert "version 2 added" in second.stdout and "versions now 1, 2" in second.stdout
    assert list_versions(store, "toy") == [1, 2]
    assert sorted(p.name for p in (store / "toy").iterdir()) == ["1", "2"]
    for version in (1, 2):
        assert (store / "toy" / str(version) / "model.onnx").is_file()
    bad = toy_model.add_toy(store, work, "toy", "toyscore.tasks:VectorScore", "--version", "0")
    assert bad.returncode != 0 and "version" in bad.stderr


def test_funnel_traffic_sets_shows_and_clears(redis_client, redis_server, keys, tmp_path):
    url = ["--redis-url", redis_server.url, "--model-store", str(tmp_path)]

    def run(*args):
        return subprocess.run([FUNNEL, "traffic", *args, *url], capture_output=True, text=True, timeout=60)

    shown = run(MODEL)
    assert shown.returncode == 0 and "no traffic policy" in shown.stdout
    done = run(MODEL, "1=0", "3=100")
    assert done.returncode == 0, done.stderr
    assert traffic.read(redis_client, keys, MODEL) == {1: 0, 3: 100}
    assert "version 3" in done.stdout and "no live worker: skipped" in done.stdout
    for bad, message in ((["1=0"], "all zero"), (["1=-4"], "negative"), (["one=4"], "integer"),
                         (["1"], "VERSION=WEIGHT"), (["1=4", "--clear"], "no weights")):
        refused = run(MODEL, *bad)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert traffic.read(redis_client, keys, MODEL) == {1: 0, 3: 100}  # nothing refused was written
    cleared = run(MODEL, "--clear")
    assert cleared.returncode == 0 and not redis_client.exists(keys.traffic(MODEL))
    # A store that has the model refuses a weight for a version it lacks.
    (tmp_path / MODEL / "1").mkdir(parents=True)
    (tmp_path / MODEL / "1" / "model.json").write_text("{}")
    unknown = run(MODEL, "1=50", "2=50")
    assert unknown.returncode == 2 and "no version 2" in unknown.stderr
