"""Models run in Python (a task's load and predict), served with no graph file.

docs/models.md's walkthroughs, each a package outside Funnel (tests/third_party):
MiniLM through transformers, torch eager (eagerminilm); a scikit-learn
classifier saved with joblib (irisclassifier). Their answers through Funnel
equal their own code's run in-process, alone and batched. The toy scorer in
Python (toyscore.tasks:PythonScore) shows a predict that fails for one item's
content failing that item alone, and one that hangs or crashes ended without
the worker.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from funnel_client import Client
from tests import toy_model
from tests.support import http, wait_for
from tests.toy_model import LABELS, expected_scores, funnel

SENTENCES = ["A man is eating food.", "A man is riding a horse.", "The new movie is awesome",
             "Two dogs run across a field of snow.", "Nucleotides pair: adenine with thymine, guanine with cytosine.",
             "short", "A woman is playing the violin while a child listens, delighted, by the window."]
IRIS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5], [4.4, 2.9, 1.4, 0.2], [6.3, 2.5, 5.0, 1.9]]


@pytest.fixture(scope="module")
def outside_env() -> dict:
    return toy_model.outside_env()


@pytest.fixture(scope="module")
def own():
    """The walkthroughs' own code, imported as their user would, with their folder on the path: the
    answers in-process, without Funnel."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(toy_model.PACKAGE_DIR))
        return SimpleNamespace(minilm=importlib.import_module("eagerminilm.minilm"),
                               iris=importlib.import_module("irisclassifier.iris"))


@pytest.fixture(scope="module")
def store(tmp_path_factory, outside_env, own) -> Path:
    minilm, iris = own.minilm, own.iris
    store, work = tmp_path_factory.mktemp("store"), tmp_path_factory.mktemp("work")
    done = funnel("add", "minilm", "--store", str(store), "--task", "eagerminilm.tasks:Embedder",
                  "--file", f"weights={minilm.weights_folder()}", "--outputs", "embedding", "--batch-size", "8",
                  env=outside_env)
    assert done.returncode == 0, done.stderr
    iris.fit(work / "iris.joblib")
    done = funnel("add", "iris", "--store", str(store), "--task", "irisclassifier.tasks:Species",
                  "--file", f"model={work / 'iris.joblib'}", "--outputs", "probabilities", env=outside_env)
    assert done.returncode == 0, done.stderr
    toy_model.add_python(store, work, "py-score", "--set", "pace_batch_s=0.2", "--set", "predict_timeout_s=3",
                         "--batch-size", "8")
    return store


@pytest.fixture(scope="module")
def stack(store):
    with toy_model.outside_stack(store) as running:
        yield running


def model_processes(worker: subprocess.Popen) -> list[str]:
    """The pids of the worker's model processes."""
    found = subprocess.run(["pgrep", "-P", str(worker.pid), "-f", "funnel.worker.model_process"],
                           capture_output=True, text=True)
    return found.stdout.split()


def predict(stack, model: str, body: dict) -> tuple[int, dict]:
    status, answer, _ = http("POST", f"{stack.url}/v1/models/{model}/predict", json_body=body)
    return status, answer


def test_add_takes_a_python_task_without_a_graph_and_a_graph_task_not(tmp_path, outside_env, store):
    spec = json.loads((store / "py-score" / "model.json").read_text())
    assert "onnx" not in spec and "torchscript" not in spec and spec["outputs"] == ["scores"]
    done = funnel("add", "x", "--store", str(tmp_path), "--task", "toyscore.tasks:VectorScore", env=outside_env)
    assert done.returncode != 0 and "give --onnx, --torchscript" in done.stderr


def test_workers_say_they_run_python(stack):
    for model in ("minilm", "iris", "py-score"):
        status, body, _ = http("GET", f"{stack.url}/v1/models/{model}")
        assert status == 200 and {w["backend"] for w in body["workers"]} == {"python"}, body


def test_each_model_process_runs_on_tcmalloc(stack):
    """torch eager in a model's process allocates as the torch backend's worker does (worker/allocator.py)."""
    from funnel.worker.allocator import tcmalloc_path

    if not tcmalloc_path():
        pytest.skip("tcmalloc is preloaded only where libtcmalloc-minimal4 is installed")
    children = [pid for worker in stack.workers for pid in model_processes(worker)]
    assert children, "no model process"
    for pid in children:
        assert "tcmalloc" in Path(f"/proc/{pid}/maps").read_text(), pid


def test_eager_minilm_answers_what_its_own_code_answers_alone_and_batched(stack, own):
    minilm = own.minilm
    folder = minilm.weights_folder()
    tokens, model = minilm.tokenizer(folder), minilm.load_model(folder)
    want = np.concatenate([minilm.embed(model, *minilm.pad([np.asarray(tokens.encode(s).ids)])) for s in SENTENCES])
    with Client(stack.url) as client:
        alone = [client.predict("minilm", text=s)["embedding"] for s in SENTENCES[:2]]
        with concurrent.futures.ThreadPoolExecutor(len(SENTENCES)) as pool:
            beside = list(pool.map(lambda s: client.predict("minilm", text=s), SENTENCES))
        many = client.predict("minilm", texts=SENTENCES)
    np.testing.assert_allclose(np.asarray(alone), want[:2], atol=1e-5)
    np.testing.assert_allclose(np.asarray([b["embedding"] for b in beside]), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray([m["embedding"] for m in many["results"]]), want, atol=1e-5)
    assert max(meta["batch_size"] for meta in many["meta"]) >= len(SENTENCES)  # one call, padded to the longest


def test_scikit_learn_answers_what_its_own_code_answers(stack, own):
    iris = own.iris
    want = iris.probabilities(iris.load(next(Path(stack.model_store).glob("iris/*.joblib"))), np.asarray(IRIS))
    with Client(stack.url) as client:
        many = client.predict("iris", inputs=IRIS)["results"]
        one = client.predict("iris", input=IRIS[1])
    got = np.asarray([[m["probabilities"][s] for s in iris.SPECIES] for m in many])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert [m["species"] for m in many] == [iris.SPECIES[i] for i in want.argmax(axis=1)]
    assert one["species"] == many[1]["species"]
    status, body = predict(stack, "iris", {"input": [1, 2, 3]})
    assert status == 400 and body["error"]["code"] == "bad_input"


def _concurrently(stack, vectors: list[list[float]]) -> list[tuple[int, dict]]:
    """Each vector its own request, all at once: the paced model takes them in one or two batches."""
    with concurrent.futures.ThreadPoolExecutor(len(vectors)) as pool:
        return list(pool.map(lambda v: predict(stack, "py-score", {"input": v}), vectors))


@pytest.mark.parametrize(("culprit", "status", "code"), [(666, 400, "refused_by_model"),
                                                          (777, 500, "inference_failed")])
def test_an_item_whose_content_fails_predict_fails_alone(stack, culprit, status, code):
    vectors = toy_model.vectors(8, seed=culprit)
    vectors[5][0] = culprit
    answers = _concurrently(stack, vectors)
    want = expected_scores(np.asarray(vectors))
    for i, (got_status, body) in enumerate(answers):
        if i == 5:
            assert (got_status, body["error"]["code"]) == (status, code), body
        else:
            assert got_status == 200, body
            np.testing.assert_allclose(body["scores"], want[i], atol=1e-5)
            assert body["label"] == LABELS[int(want[i].argmax())]
    assert max(body["meta"]["batch_size"] for s, body in answers if s == 200) > 1  # it shared a batch


def test_a_predict_that_hangs_is_ended_at_its_deadline_and_the_model_serves_on(stack):
    started = time.monotonic()
    status, body = predict(stack, "py-score", {"input": [999, 1, 1, 1]})
    assert (status, body["error"]["code"]) == (504, "predict_timeout"), body
    assert time.monotonic() - started < 3 + 10  # its deadline, a fresh process, and the request's own way
    status, body = predict(stack, "py-score", {"input": [1, 2, 3, 4]})
    assert status == 200, body
    np.testing.assert_allclose(body["scores"], expected_scores(np.asarray([[1, 2, 3, 4]]))[0], atol=1e-5)


def test_a_predict_that_kills_its_process_fails_its_call_and_the_worker_lives(stack):
    status, body = predict(stack, "py-score", {"input": [13, 1, 1, 1]})
    assert (status, body["error"]["code"]) == (500, "inference_failed") and "died" in body["error"]["message"]
    status, body = predict(stack, "py-score", {"input": [1, 2, 3, 4]})
    assert status == 200, body
    assert all(worker.poll() is None for worker in stack.workers)


def test_v2_and_bulk_jobs_reach_the_python_path(stack):
    vectors = toy_model.vectors(3, seed=4)
    want = expected_scores(np.asarray(vectors))
    status, body, _ = http("POST", f"{stack.url}/v2/models/py-score/infer", json_body={
        "inputs": [{"name": "JSON", "datatype": "BYTES", "shape": [3], "data": [json.dumps(v) for v in vectors]}]})
    assert status == 200, body
    (scores,) = [o for o in body["outputs"] if o["name"] == "scores"]
    np.testing.assert_allclose(np.asarray(scores["data"]).reshape(3, 3), want, atol=1e-5)
    with Client(stack.url) as client:
        job = client.submit_job("py-score", inputs=vectors)
        assert client.wait(job["id"], timeout=60)["state"] == "done"
        results = list(client.results(job["id"]))
    np.testing.assert_allclose([r["scores"] for r in results], want, atol=1e-5)


def test_the_model_process_dies_with_its_worker(stack, store, outside_env, tmp_path):
    """kill -9 of a worker leaves no model process behind: it looks for its worker, and ends itself."""
    env = {"PYTHONPATH": outside_env["PYTHONPATH"]}
    worker = stack.start_worker("iris", **env)
    children = wait_for(lambda: model_processes(worker), timeout_s=60, what="the worker's model process")
    worker.kill()
    worker.wait()
    for pid in children:  # within WATCH_S when the host is quiet; the bound leaves room for a loaded one
        wait_for(lambda pid=pid: ended(pid), timeout_s=15, what=f"model process {pid} to end with its worker")


def ended(pid: str) -> bool:
    """Gone, or a zombie: it has exited and waits only for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_worker_of_several_python_models_ends_the_process_of_each_it_evicts(store, tmp_path):
    """One resident at a time: serving the other model evicts the first, whose process is gone, measured."""
    from funnel.scripts.stack import Stack

    env = {"PYTHONPATH": str(toy_model.PACKAGE_DIR)}
    with Stack(model_store=store, models=["iris", "py-score"], workers=[], web_env=env, worker_env=env,
               log_dir=tmp_path) as stack:
        worker = stack.start_worker("iris,py-score", FUNNEL_MAX_RESIDENT="1", **env)
        stack.wait_ready(60, expected={"iris": 1, "py-score": 1})

        for model, body in (("iris", {"input": IRIS[0]}), ("py-score", {"input": [1, 2, 3, 4]}),
                            ("iris", {"input": IRIS[1]})):
            status, answer = predict(stack, model, body)
            assert status == 200, answer
            assert len(model_processes(worker)) == 1  # the one resident; the one evicted has ended
        log = next(tmp_path.glob("worker-iris*.log")).read_text()
        assert "ended," in log and "MB freed" in log
