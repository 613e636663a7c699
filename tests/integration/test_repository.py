"""Triton's repository control against a live stack, through tritonclient unmodified: unload drains a
version under load (nothing lost, nothing answered twice, its queue empty when unload answers) and
load serves it again; a whole model unloaded and loaded; a new model's version loaded from a config
and files, served once its worker starts; admin keys only; bad parameters refused."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from funnel.common.contracts import repository
from funnel.common.contracts.keys import Keys
from funnel.scripts.redis_local import free_port
from funnel.scripts.stack import Stack
from tests import toy_model
from tests.support import http, metric, wait_for

TEXT = "text-embedding"
ADMIN, USER = "admin-key-0123456789", "user-key-0123456789"
CLIENTS = 6
SENTENCES = [f"repository sentence {i} about {'boats ' * (i % 3)}and trains" for i in range(24)]


def as_admin() -> dict[str, str]:
    """Fresh each call: tritonclient.http adds its own headers to the dict it is given. gRPC: lower case."""
    return {"authorization": f"Bearer {ADMIN}"}


def as_user() -> dict[str, str]:
    return {"authorization": f"Bearer {USER}"}


@pytest.fixture(scope="module")
def stack(model_store, tmp_path_factory):
    """The text model as versions 1 and 2 (the same files: which version answered is in the answer), a
    worker of each; the outside test packages importable, for the toy model a load adds."""
    store = tmp_path_factory.mktemp("repository-store")
    (store / TEXT).mkdir()
    for version in (1, 2):
        (store / TEXT / str(version)).symlink_to(model_store / TEXT, target_is_directory=True)
    outside = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}
    keys = {"FUNNEL_API_KEYS": f"ops={ADMIN},app={USER}", "FUNNEL_ADMIN_KEYS": "ops"}
    with Stack(model_store=store, models=[TEXT], workers=[f"{TEXT}:1", f"{TEXT}:2"], grpc_port=free_port(),
               web_env={**outside, **keys, "FUNNEL_MODELS": ""}, worker_env=outside,  # every model in the store
               log_dir=tmp_path_factory.mktemp("repository-logs")) as running:
        yield running


@pytest.fixture(scope="module")
def admin_http(stack):
    client = httpclient.InferenceServerClient(stack.url.removeprefix("http://"), network_timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def admin_grpc(stack):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    yield client
    client.close()


def text_input(sentence: str):
    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([sentence.encode()], dtype=object))
    return text


def infer(client, sentence: str, version: str = "") -> tuple[str, np.ndarray]:
    result = client.infer(TEXT, [text_input(sentence)], model_version=version, headers=as_user())
    return result.get_response()["model_version"], result.as_numpy("embedding")[0]


def index(client) -> dict[tuple[str, str], tuple[str, str]]:
    return {(m["name"], m["version"]): (m["state"], m["reason"])
            for m in client.get_model_repository_index(headers=as_admin())}


def change(stack, what: str, name: str, parameters: dict, key: str = ADMIN) -> tuple[int, dict]:
    status, body, _ = http("POST", f"{stack.url}/v2/repository/models/{name}/{what}", timeout=120,
                           json_body={"parameters": parameters}, headers={"Authorization": f"Bearer {key}"})
    return status, body


def held(stack, version: int) -> int:
    with redis.Redis.from_url(stack.redis_url) as client:
        return repository.holding(client, Keys(), TEXT, [version])


def test_a_version_unloaded_under_load_drains_and_loads_again(stack, admin_grpc):
    probe = httpclient.InferenceServerClient(stack.url.removeprefix("http://"))
    expected = {s: infer(probe, s, "1")[1] for s in SENTENCES}  # the server's own answer to each, from version 1
    answers: list[tuple[float, str, bool]] = []  # (sent at, version, right)
    failures: list[str] = []
    lock, stop = threading.Lock(), threading.Event()

    def send(offset: int) -> None:
        client = httpclient.InferenceServerClient(stack.url.removeprefix("http://"), network_timeout=60)
        i = offset
        while not stop.is_set():
            sentence, sent = SENTENCES[i % len(SENTENCES)], time.monotonic()
            try:
                version, embedding = infer(client, sentence)
            except InferenceServerException as exc:
                with lock:
                    failures.append(str(exc))
            else:
                with lock:
                    answers.append((sent, version, bool(np.allclose(embedding, expected[sentence], atol=1e-4))))
            i += CLIENTS
        client.close()

    def since(moment: float) -> list[tuple[float, str, bool]]:
        with lock:
            return [a for a in answers if a[0] >= moment]

    clients = [threading.Thread(target=send, args=(n,)) for n in range(CLIENTS)]
    for thread in clients:
        thread.start()
    try:
        wait_for(lambda: len(since(0)) >= 100, timeout_s=60, what="answers before the unload")
        assert {a[1] for a in since(0)} == {"2"}  # the highest live version takes the unpinned requests
        status, body = change(stack, "unload", TEXT, {"version": 2})
        unloaded = time.monotonic()
        assert status == 200 and body == {}, body
        assert held(stack, 2) == 0  # drained: its queues and its worker's in-flight list empty
        assert index(probe)[TEXT, "2"] == ("UNAVAILABLE", "unloaded")
        assert index(probe)[TEXT, "1"] == ("READY", "")
        wait_for(lambda: len(since(unloaded)) >= 100, timeout_s=60, what="answers with version 2 unloaded")
        assert {a[1] for a in since(unloaded)} == {"1"}
        # gRPC, as Triton's own stub sends it: the version in the parameters map
        stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}"))
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(
            model_name=TEXT, parameters={"version": pb.ModelRepositoryParameter(int64_param=2)}),
            metadata=[("authorization", f"Bearer {ADMIN}")], timeout=60)
        loaded = time.monotonic()
        assert index(probe)[TEXT, "2"] == ("READY", "")
        wait_for(lambda: len(since(loaded)) >= 100, timeout_s=60, what="answers with version 2 loaded again")
        assert {a[1] for a in since(loaded)} == {"2"}
    finally:
        stop.set()
        for thread in clients:
            thread.join(60)
    assert not failures, Counter(failures).most_common(3)
    assert all(a[2] for a in answers), "an answer with another request's embedding"
    # None answered twice: a second answer is left in a reply list, or found waited for by nobody.
    with redis.Redis.from_url(stack.redis_url) as client:
        assert not list(client.scan_iter("funnel:reply:*"))
    scraped = http("GET", f"{stack.url}/metrics", headers=as_admin())[1]["_text"]
    assert metric(scraped, "funnel_replies_unclaimed_total") == 0
    print(f"\nrepository: {len(answers)} answers under load, all right, none lost, none twice; "
          f"versions {dict(Counter(a[1] for a in answers))}")
    probe.close()


def test_a_whole_model_unloaded_and_loaded_by_tritonclient(stack, admin_http, admin_grpc):
    admin_grpc.unload_model(TEXT, headers=as_admin())
    assert {index(admin_http)[TEXT, v] for v in ("1", "2")} == {("UNAVAILABLE", "unloaded")}
    assert not admin_http.is_model_ready(TEXT, headers=as_user())
    assert admin_http.is_server_ready(headers=as_user())  # an unloaded model is not one waiting for a worker
    with pytest.raises(InferenceServerException, match="unloaded"):
        infer(admin_http, SENTENCES[0])
    with pytest.raises(InferenceServerException, match="unloaded"):
        infer(admin_http, SENTENCES[0], "1")
    status, body, _ = http("GET", f"{stack.url}/v1/models/{TEXT}", headers=as_user())
    assert status == 200 and [v["unloaded"] for v in body["versions"]] == [True, True]
    inspected = subprocess.run([str(Path(sys.executable).parent / "funnel"), "inspect", "--redis-url",
                                stack.redis_url], capture_output=True, text=True, timeout=60)
    assert inspected.returncode == 0 and "unloaded: 1, 2" in inspected.stdout, inspected.stdout + inspected.stderr
    admin_http.load_model(TEXT, headers=as_admin())
    assert admin_http.is_model_ready(TEXT, headers=as_user())
    assert infer(admin_http, SENTENCES[0])[0] == "2"


def test_load_adds_a_version_from_a_config_and_files(stack, admin_http, tmp_path):
    toy_model.write_graph(tmp_path / "toy.onnx")
    config = {"task": "toyscore.tasks:VectorScore", "onnx": "toy.onnx", "labels": "classes.txt", "dim": 4,
              "batch_size": 8}
    files = {"file:1/toy.onnx": (tmp_path / "toy.onnx").read_bytes(),
             "file:1/classes.txt": "\n".join(toy_model.LABELS).encode()}
    failed: list[Exception] = []

    def load() -> None:  # tritonclient.http, as it sends files: base64 in the JSON parameters
        client = httpclient.InferenceServerClient(stack.url.removeprefix("http://"), network_timeout=120)
        try:
            client.load_model("toy", headers=as_admin(), config=json.dumps(config), files=files)
        except Exception as exc:
            failed.append(exc)
        finally:
            client.close()

    # Two loads of the same new version at once: one adds it, the other is told it is there.
    loading = [threading.Thread(target=load) for _ in range(2)]
    for thread in loading:
        thread.start()  # the one that adds it answers once a worker serves it: start one when it is stored
    wait_for(lambda: (Path(stack.model_store) / "toy" / "1" / "model.json").exists() and failed,
             what="toy added, and the second load refused")
    stack.start_worker("toy:1")
    for thread in loading:
        thread.join(120)
    assert not any(thread.is_alive() for thread in loading)
    assert len(failed) == 1 and "already has version 1" in str(failed[0]), failed
    assert index(admin_http)["toy", "1"] == ("READY", "")
    vectors = toy_model.vectors(5)
    status, body, _ = http("POST", f"{stack.url}/v1/models/toy/predict", json_body={"inputs": vectors},
                           headers=as_user())
    assert status == 200, body
    assert np.allclose([r["scores"] for r in body["results"]], toy_model.expected_scores(np.array(vectors)),
                       atol=1e-5)
    status, body = change(stack, "load", "toy", {"config": json.dumps(config), "file:1/toy.onnx": ""})
    assert status == 409 and "already has version 1" in body["error"]


@pytest.mark.parametrize("what, name, parameters, status, says", [
    ("load", "bad", {"config": "{not json"}, 400, "JSON text"),
    ("load", "bad", {"config": json.dumps({"task": "nowhere.tasks:Thing"})}, 400, "cannot be imported"),
    ("load", "bad", {"config": json.dumps({"task": "text_embedding"}), "file:1/../escape.onnx": "AA=="}, 400,
     "never outside"),
    ("load", "bad", {"config": json.dumps({"task": "text_embedding"}), "file:1/model.json": "AA=="}, 400,
     "model.json is the config"),
    ("load", "bad", {"config": json.dumps({"task": "text_embedding"}), "file:1/m.onnx": "not base64!"}, 400,
     "not base64"),
    ("load", "bad", {"file:1/m.onnx": "AA=="}, 400, "files come with their config"),
    ("load", "nothing-here", {}, 404, "no model named"),
    ("unload", TEXT, {"version": 7}, 404, "no version 7"),
    ("unload", TEXT, {"version": "two"}, 400, "positive integer"),
])
def test_bad_calls_are_refused_and_change_nothing(stack, what, name, parameters, status, says):
    answered, body = change(stack, what, name, parameters)
    assert answered == status and says in body["error"], body
    assert not (Path(stack.model_store) / "bad").exists()
    with redis.Redis.from_url(stack.redis_url) as client:
        assert repository.read(client, Keys(), TEXT) == frozenset()


def test_only_admin_keys_change_the_repository(stack, admin_grpc):
    """An API key that is no admin key: 403 over HTTP, PERMISSION_DENIED over gRPC."""
    for what in ("load", "unload"):
        status, body = change(stack, what, TEXT, {}, key=USER)
        assert status == 403 and "admin" in body["error"], body
    with pytest.raises(InferenceServerException, match="admin"):
        admin_grpc.unload_model(TEXT, headers=as_user())
    with redis.Redis.from_url(stack.redis_url) as client:
        assert repository.read(client, Keys(), TEXT) == frozenset()  # nothing unloaded
