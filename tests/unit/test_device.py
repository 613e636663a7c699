"""FUNNEL_DEVICE=auto: the least used device, counted from the registry in a real Redis.

The GPUs here are names in a candidate list (FUNNEL_DEVICES): the choice is
plain bookkeeping in Redis, so it is tested on the CPU.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from funnel.worker import device as devices
from funnel.worker.heartbeat import Heartbeat

GPUS = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def register(client, keys, worker_id: str, device: str, model: str = "text-embedding") -> None:
    """A live worker, registered exactly as a running worker's heartbeat does it."""
    Heartbeat(client, keys, worker_id, {"model": model, "backend": "onnx", "device": device},
              recovery=None, ttl_s=30).beat()


def register_dead(client, keys, worker_id: str, model: str = "text-embedding") -> None:
    """Registered, but its heartbeat hash has expired: not counted."""
    client.hset(keys.workers(), worker_id, model)


def test_empty_registry_takes_the_first_candidate(redis_client, keys):
    assert devices.choose(redis_client, keys, GPUS, "w1") == "cuda:0"


def test_fewest_live_workers_of_any_model(redis_client, keys):
    register(redis_client, keys, "a", "cuda:0")
    register(redis_client, keys, "b", "cuda:0", model="image-classifier")
    register(redis_client, keys, "c", "cuda:1", model="image-classifier")
    register(redis_client, keys, "d", "cuda:2")
    register(redis_client, keys, "e", "cpu")  # not a candidate: ignored
    assert devices.live_counts(redis_client, keys) == {"cuda:0": 2, "cuda:1": 1, "cuda:2": 1, "cpu": 1}
    assert devices.choose(redis_client, keys, GPUS, "new") == "cuda:3"
    assert devices.choose(redis_client, keys, GPUS[:3], "new2") == "cuda:1"  # tie: the first


def test_a_worker_of_several_models_counts_once(redis_client, keys):
    beat = Heartbeat(redis_client, keys, "many.a.1", {"model": "a", "backend": "onnx", "device": "cuda:0"},
                     recovery=None, ttl_s=30)
    for model in ("b", "c"):
        beat.join(f"many.{model}.1", {"model": model, "backend": "onnx", "device": "cuda:0"})
    beat.live = lambda: {m.worker_id: {"process": "many", "state": "cold", "load_error": ""} for m in beat.members}
    beat.beat()
    register(redis_client, keys, "one", "cuda:1")
    assert devices.live_counts(redis_client, keys) == {"cuda:0": 1, "cuda:1": 1}
    assert devices.choose(redis_client, keys, ["cuda:1", "cuda:0"], "new") == "cuda:1"  # a tie: the first


def test_dead_workers_do_not_count(redis_client, keys):
    register(redis_client, keys, "live", "cuda:1")
    for i in range(3):
        register_dead(redis_client, keys, f"dead-{i}")
    redis_client.hset(keys.worker("text-embedding", "expiring"), mapping={"device": "cuda:0"})
    redis_client.hset(keys.workers(), "expiring", "text-embedding")
    redis_client.delete(keys.worker("text-embedding", "expiring"))  # what the TTL running out does
    assert devices.live_counts(redis_client, keys) == {"cuda:1": 1}
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "new") == "cuda:0"
    assert devices.choose(redis_client, keys, ["cuda:1", "cuda:0"], "new") == "cuda:0"


def test_replicas_started_one_after_another_spread_evenly(redis_client, keys):
    chosen = [devices.choose(redis_client, keys, GPUS, f"w{i}") for i in range(10)]
    assert chosen[:4] == GPUS
    assert Counter(chosen) == {"cuda:0": 3, "cuda:1": 3, "cuda:2": 2, "cuda:3": 2}


def test_replicas_started_at_once_spread_evenly(redis_client, keys):
    """Claims are counted and written in one script: simultaneous starts see each other."""
    chosen: list[str] = []
    lock, go = threading.Lock(), threading.Barrier(16)

    def start(i: int) -> None:
        go.wait()
        got = devices.choose(redis_client, keys, GPUS, f"replica-{i}")
        with lock:
            chosen.append(got)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(chosen) == {gpu: 4 for gpu in GPUS}


def test_a_worker_is_counted_once_while_both_claimed_and_registered(redis_client, keys):
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "first") == "cuda:0"
    register(redis_client, keys, "first", "cuda:0")  # loaded, now beating: claim still fresh
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "second") == "cuda:1"
    register(redis_client, keys, "second", "cuda:1")
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "third") == "cuda:0"


def test_a_restart_under_the_same_id_does_not_count_itself(redis_client, keys):
    register(redis_client, keys, "fixed-id", "cuda:1")
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "other") == "cuda:0"
    # fixed-id restarts: its old registration and claim are its own, only "other" counts.
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "fixed-id") == "cuda:1"
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "fixed-id") == "cuda:1"
    members = [m.decode() for m in redis_client.zrange(keys.device_claims(), 0, -1)]
    assert sorted(members) == ["cuda:0 other", "cuda:1 fixed-id"]  # one claim per worker


def test_expired_claims_do_not_count(redis_client, keys):
    key = keys.device_claims()
    redis_client.zadd(key, {"cuda:0 long-gone": 1})  # expired in 1970
    assert devices.choose(redis_client, keys, ["cuda:0", "cuda:1"], "w") == "cuda:0"
    assert redis_client.zscore(key, "cuda:0 long-gone") is None  # swept


def test_keys_follow_the_prefix(redis_client):
    from funnel.common.contracts.keys import Keys

    other = Keys("other")
    register(redis_client, Keys("funnel"), "a", "cuda:0")
    assert devices.choose(redis_client, other, ["cuda:0", "cuda:1"], "w") == "cuda:0"
    assert redis_client.exists("other:device-claims")


def test_resolve(redis_client, keys):
    # A concrete device is kept as given, Redis not consulted.
    assert devices.resolve("cuda:3", [], "onnx", None, keys, "w") == "cuda:3"
    assert devices.resolve("cpu", GPUS, "onnx", None, keys, "w") == "cpu"
    # One candidate: no choice to make.
    assert devices.resolve("auto", ["cuda:1"], "onnx", None, keys, "w") == "cuda:1"
    # Several: the least used one.
    register(redis_client, keys, "busy", "cuda:0")
    assert devices.resolve("auto", ["cuda:0", "cuda:1"], "onnx", redis_client, keys, "w") == "cuda:1"
    with pytest.raises(ValueError):
        devices.resolve("gpu0", [], "onnx", None, keys, "w")
    with pytest.raises(ValueError):
        devices.choose(redis_client, keys, ["cuda:0", "tpu"], "w")


def test_resolve_without_a_gpu_falls_back_to_the_cpu(keys):
    if devices.cuda_devices("onnx"):
        pytest.skip("this host has a CUDA device for onnxruntime")
    assert devices.resolve("auto", [], "onnx", None, keys, "w") == "cpu"


def test_cuda_devices_lists_what_the_backend_sees():
    for backend in ("onnx", "torch"):
        found = devices.cuda_devices(backend)
        assert found == [f"cuda:{i}" for i in range(len(found))]
    assert devices.cuda_device_count() >= 0


def test_devices_setting(monkeypatch):
    from funnel.worker.settings import WorkerSettings

    monkeypatch.setenv("FUNNEL_MODEL", "text-embedding")
    monkeypatch.setenv("FUNNEL_DEVICE", "auto")
    monkeypatch.setenv("FUNNEL_DEVICES", "cuda:0, cuda:1")
    loaded = WorkerSettings.load([])
    assert (loaded.device, loaded.devices) == ("auto", ["cuda:0", "cuda:1"])
    monkeypatch.delenv("FUNNEL_DEVICES")
    assert WorkerSettings.load([]).devices == []
